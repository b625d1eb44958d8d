package cases

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestCompletionStatusNames: completion statuses print one way in the
// report, the libibverbs name and the number ("WR_FLUSH_ERR (5)"), in
// observations and in completions printed whole.
func TestCompletionStatusNames(t *testing.T) {
	for st, want := range map[int]string{0: "SUCCESS (0)", 5: "WR_FLUSH_ERR (5)", 12: "RETRY_EXC_ERR (12)", 13: "RNR_RETRY_EXC_ERR (13)", 21: "GENERAL_ERR (21)", 99: "UNKNOWN (99)"} {
		if got := wcStatusName(st); got != want {
			t.Errorf("status %d: %q, want %q", st, got, want)
		}
	}
	if got := statusOf(&Completion{Status: 12}); got != "RETRY_EXC_ERR (12)" {
		t.Errorf("statusOf: %q", got)
	}
	wc := &Completion{WRID: 71, Status: 9, ByteLen: 40, WithImm: true, Imm: 0x11223344}
	if got, want := (*wc).String(), "wr 71 status REM_INV_REQ_ERR (9) opcode 0 40 bytes imm 0x11223344"; got != want {
		t.Errorf("completion %q, want %q", got, want)
	}

	tgt, err := NewSoftroceTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := RunAll(ctx, []Target{tgt}, All, Options{Only: regexp.MustCompile(`^(requester-retry-exhausted|requester-nak-invalid-request)$`)})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{
		"requester-retry-exhausted":     "completion status RETRY_EXC_ERR (12)",
		"requester-nak-invalid-request": "[wr 71 status REM_INV_REQ_ERR (9) wr 72 status WR_FLUSH_ERR (5)]",
	} {
		r := rep.Result(id, "softroce")
		if r == nil || !strings.Contains(r.Observed, want) || regexp.MustCompile(`status \d`).MatchString(r.Observed) {
			t.Errorf("%s: observed %+v, want %q", id, r, want)
		}
	}
}
