package cases

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// driverTarget is softroce dressed as a remote host whose device's driver
// is rxe: what the report and the verdicts key on.
type driverTarget struct {
	*SoftroceTarget
}

func (driverTarget) Name() string   { return "remote" }
func (driverTarget) Driver() string { return "rxe" }
func (driverTarget) Device() DeviceInfo {
	return DeviceInfo{Name: "rxe0", FW: "0.0.0", Driver: "rxe", VendorID: 0xffffff}
}

// TestDeviationsKeyedByDriver: a departure documented for the rxe driver
// is a documented deviation on any target whose device is rxe, whatever
// the target's name, and stays a failure on one whose driver has none.
func TestDeviationsKeyedByDriver(t *testing.T) {
	soft, err := NewSoftroceTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer soft.Close()
	remote := driverTarget{soft}
	c := &Case{ID: "synthetic-departure", Spec: "x", Known: map[string]string{"rxe": "documented for rxe"},
		Bugs: map[string]string{"mlx5_core": "a known defect"}, Run: func(x *X) { x.Failf("departs") }}
	ctx := context.Background()
	if r := Run(ctx, remote, c); r.Verdict != VerdictDeviation || r.Driver != "rxe" || r.Target != "remote" {
		t.Errorf("on a target driving rxe: verdict %s driver %q target %q, want deviation, rxe, remote", r.Verdict, r.Driver, r.Target)
	}
	if r := Run(ctx, soft, c); r.Verdict != VerdictFail || r.Driver != "softroce" {
		t.Errorf("on softroce: verdict %s driver %q, want fail, softroce", r.Verdict, r.Driver)
	}

	rep, err := RunAll(ctx, []Target{remote, soft}, []*Case{c}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := rep.Devices["remote"]; d.Name != "rxe0" || d.Driver != "rxe" {
		t.Errorf("report devices %+v", rep.Devices)
	}
	if _, ok := rep.Devices["softroce"]; ok {
		t.Error("softroce reported a device")
	}
	// softroce's failure is unexpected; the rxe-driven target's deviation is not.
	if n := rep.Unexpected(); n != 1 {
		t.Errorf("unexpected results %d, want 1 (softroce's)", n)
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| remote (rxe0, fw 0.0.0, driver rxe) |", "Documented deviation: documented for rxe", "conformance remote HOST[:PORT]"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	// A known bug is keyed by driver too.
	c.Known = nil
	c.Bugs = map[string]string{"rxe": "a known rxe defect"}
	rep, _ = RunAll(ctx, []Target{remote}, []*Case{c}, Options{})
	if n := rep.Unexpected(); n != 0 {
		t.Errorf("a known bug of the rxe driver counted as unexpected on the remote target (%d)", n)
	}
}

// rxeNamed is softroce under the rxe target's name and driver, the third
// column of TestReportThreeTargets.
type rxeNamed struct {
	*SoftroceTarget
}

func (rxeNamed) Name() string   { return "rxe" }
func (rxeNamed) Driver() string { return "rxe" }

// TestReportThreeTargets: one run over rxe, softroce and a remote device
// gives a report with a column per target in that order, the remote one
// headed with its device's name, firmware and driver, in Markdown and JSON.
func TestReportThreeTargets(t *testing.T) {
	soft, err := NewSoftroceTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer soft.Close()
	c := &Case{ID: "synthetic-three", Spec: "x", Known: map[string]string{"rxe": "documented for rxe"},
		Run: func(x *X) {
			if x.Target.Name() != "softroce" {
				x.Failf("departs on %s", x.Target.Name())
			}
		}}
	ctx := context.Background()
	rep, err := RunAll(ctx, []Target{rxeNamed{soft}, soft, driverTarget{soft}}, []*Case{c}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| case | spec expectation (section) | rxe | softroce | remote (rxe0, fw 0.0.0, driver rxe) |",
		"| `synthetic-three` | x | **⚠️ deviation (documented)**: ",
		"| rxe | 0 | 1 | 0 | 0 |", "| softroce | 1 | 0 | 0 | 0 |", "| remote (rxe0, fw 0.0.0, driver rxe) | 0 | 1 | 0 | 0 |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	var js strings.Builder
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal([]byte(js.String()), &back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Targets, []string{"rxe", "softroce", "remote"}) {
		t.Errorf("JSON targets %v", back.Targets)
	}
	if d := back.Devices["remote"]; d.Name != "rxe0" || d.FW != "0.0.0" || d.Driver != "rxe" || len(back.Devices) != 1 {
		t.Errorf("JSON devices %+v", back.Devices)
	}
	for tg, want := range map[string]string{"rxe": VerdictDeviation, "softroce": VerdictPass, "remote": VerdictDeviation} {
		if r := back.Result("synthetic-three", tg); r == nil || r.Verdict != want {
			t.Errorf("JSON result on %s: %+v, want %s", tg, r, want)
		}
	}
}
