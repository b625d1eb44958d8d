package spec

import (
	"errors"
	"strings"
	"testing"
)

func TestEach(t *testing.T) {
	var got []string
	set := func(k, v string) error {
		switch k {
		case "a", "b":
			got = append(got, k+"="+v)
			return nil
		case "bad":
			return errors.New("no")
		}
		return ErrUnknownKey
	}
	if err := Each(" A = 1 ,, b=2 ", "x", "a or b", set); err != nil || strings.Join(got, ",") != "a=1,b=2" {
		t.Fatalf("Each = %v, %q", err, got)
	}
	for in, want := range map[string]string{
		"c=1":   `x: unknown key "c" (want a or b)`,
		"a":     `x: "a": want key=value`,
		"bad=3": "x: bad=3: no",
	} {
		if err := Each(in, "x", "a or b", set); err == nil || err.Error() != want {
			t.Errorf("Each(%q) = %v, want %q", in, err, want)
		}
	}
}

func TestProb(t *testing.T) {
	for in, want := range map[string]float64{"10%": 0.1, "0.25": 0.25, "0": 0, "100%": 1} {
		if f, err := Prob(in); err != nil || f != want {
			t.Errorf("Prob(%q) = %v, %v, want %v", in, f, err, want)
		}
	}
	for in, want := range map[string]string{"10": "write 10% or 0.1", "x": "not a number", "150%": "from 0% to 100%", "-1": "from 0% to 100%"} {
		if _, err := Prob(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Prob(%q) = %v, want it to say %q", in, err, want)
		}
	}
}
