// Package spec reads the comma-separated key=value lists in which the
// relays around a link (nic/impair, nic/congest) are configured, as
// netem's and tc's users write them.
package spec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Each calls set for every key=value of s in order, the key lower-cased
// and both trimmed; empty items are skipped. An item without "=" and an
// error from set are returned prefixed with pkg ("impair: loss=x: ...").
// set returns ErrUnknownKey for a key it does not know; Each then names
// want, the keys it does.
func Each(s, pkg, want string, set func(k, v string) error) error {
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%s: %q: want key=value", pkg, kv)
		}
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		if err := set(k, v); errors.Is(err, ErrUnknownKey) {
			return fmt.Errorf("%s: unknown key %q (want %s)", pkg, k, want)
		} else if err != nil {
			return fmt.Errorf("%s: %s=%s: %w", pkg, k, v, err)
		}
	}
	return nil
}

// ErrUnknownKey is what Each's set returns for a key it does not know.
var ErrUnknownKey = errors.New("unknown key")

// Prob reads a probability: a percentage ("10%") or a fraction ("0.1").
// A bare number between 1 and 100 is refused with the two ways to write
// what was likely meant.
func Prob(v string) (float64, error) {
	pct := strings.HasSuffix(v, "%")
	f, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
	if err != nil {
		return 0, errors.New("not a number")
	}
	if pct {
		f /= 100
	}
	if !(f >= 0 && f <= 1) {
		if !pct && f > 1 && f <= 100 {
			return 0, fmt.Errorf("a probability is a percentage or a fraction: write %s%% or %s", v, strconv.FormatFloat(f/100, 'g', -1, 64))
		}
		return 0, errors.New("a probability is a percentage from 0% to 100% (10%) or a fraction from 0 to 1 (0.1)")
	}
	return f, nil
}
