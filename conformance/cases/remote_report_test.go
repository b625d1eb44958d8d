package cases

import (
	"context"
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
