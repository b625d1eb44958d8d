package uc

import (
	"fmt"
	"strings"
	"testing"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/wr"
)

var positions = []bth.Position{bth.PosNone, bth.PosFirst, bth.PosMiddle, bth.PosLast, bth.PosOnly}

var operations = []bth.Operation{bth.OpSend, bth.OpWrite, bth.OpReadRequest, bth.OpReadResponse, bth.OpAck,
	bth.OpCompareSwap, bth.OpFetchAdd, bth.OpAtomicWrite, bth.OpReserved}

// TestCheckEveryState runs every packet shape (operation, position, PSN
// relative to the expected one, including the 24-bit wrap) against every
// receiver state and checks each rule of the UC responder.
func TestCheckEveryState(t *testing.T) {
	for _, epsn := range []uint32{0, 1000, bth.PSNMask} {
		for _, open := range []Message{None, Send, Write} {
			for _, dropping := range []bool{false, true} {
				if dropping && open != None {
					continue // not reachable: dropping closes the message
				}
				for _, op := range operations {
					for _, pos := range positions {
						for _, dpsn := range []int{0, 1, -1, 5, 1 << 22} {
							r := Receiver{ePSN: epsn, open: open, dropping: dropping}
							psn := bth.PSNAdd(epsn, dpsn)
							v := r.Check(psn, op, pos)
							name := fmt.Sprintf("e=%d open=%v dropping=%v %v/%d psn%+d", epsn, open, dropping, op, pos, dpsn)
							checkRules(t, name, epsn, open, dropping, op, pos, psn, v, r)
						}
					}
				}
			}
		}
	}
}

func checkRules(t *testing.T, name string, epsn uint32, open Message, dropping bool, op bth.Operation, pos bth.Position,
	psn uint32, v Verdict, after Receiver) {
	t.Helper()
	m := map[bth.Operation]Message{bth.OpSend: Send, bth.OpWrite: Write}[op]
	isUC := op == bth.OpSend || op == bth.OpWrite
	start := pos == bth.PosFirst || pos == bth.PosOnly
	cont := pos == bth.PosMiddle || pos == bth.PosLast
	wantExec := isUC && (start || cont && !dropping && psn == epsn && open == m)
	if v.Execute != wantExec {
		t.Errorf("%s: Execute=%v, want %v", name, v.Execute, wantExec)
	}
	if v.Execute != (v.Why == Accepted) {
		t.Errorf("%s: Execute=%v with reason %v", name, v.Execute, v.Why)
	}
	// A message left open is abandoned by anything but its own next packet.
	wantAbandon := open != None && !(v.Execute && cont)
	if v.Abandon != wantAbandon {
		t.Errorf("%s: Abandon=%v, want %v", name, v.Abandon, wantAbandon)
	}
	switch {
	case v.Execute:
		if after.ePSN != bth.PSNAdd(psn, 1) {
			t.Errorf("%s: executed, expects %d next, want %d", name, after.ePSN, bth.PSNAdd(psn, 1))
		}
		if after.dropping {
			t.Errorf("%s: executed but dropping", name)
		}
		wantOpen := None
		if pos == bth.PosFirst || pos == bth.PosMiddle {
			wantOpen = m
		}
		if after.open != wantOpen {
			t.Errorf("%s: open %v after, want %v", name, after.open, wantOpen)
		}
	default:
		if !after.dropping || after.open != None {
			t.Errorf("%s: dropped packet leaves dropping=%v open=%v", name, after.dropping, after.open)
		}
		if after.ePSN != epsn {
			t.Errorf("%s: dropped packet moved the expected PSN %d -> %d", name, epsn, after.ePSN)
		}
		var want Reason
		switch {
		case !isUC || !start && !cont:
			want = NotRequest
		case dropping:
			want = Dropping
		case psn != epsn:
			want = PSNError
		case open == None:
			want = NoFirst
		default:
			want = WrongOp
		}
		if v.Why != want {
			t.Errorf("%s: reason %v, want %v", name, v.Why, want)
		}
	}
}

// pkt is a packet in a sequence test: "F3" is a SEND FIRST at PSN 3, "w"
// prefixes make it a WRITE ("wM4").
type pkt struct {
	op  bth.Operation
	pos bth.Position
	psn uint32
}

func parseSeq(s string) []pkt {
	var out []pkt
	for _, f := range strings.Fields(s) {
		p := pkt{op: bth.OpSend}
		if f[0] == 'w' {
			p.op, f = bth.OpWrite, f[1:]
		}
		p.pos = map[byte]bth.Position{'F': bth.PosFirst, 'M': bth.PosMiddle, 'L': bth.PosLast, 'O': bth.PosOnly}[f[0]]
		fmt.Sscanf(f[1:], "%d", &p.psn)
		out = append(out, p)
	}
	return out
}

// TestSequences walks packet sequences as a lossy, duplicating link
// delivers them and checks which packets are executed and which
// messages are abandoned.
func TestSequences(t *testing.T) {
	cases := []struct {
		name, seq string
		exec      string // per packet: x executed, . dropped, a abandoned the open message and executed, A abandoned and dropped
	}{
		{"in order", "F0 M1 M2 L3 O4 wF5 wL6", "xxxxxxx"},
		{"gap in the middle drops the rest, next message arrives", "F0 M1 L3 F4 M5 L6", "xxAxxx"},
		{"lost LAST: the next FIRST abandons and starts", "F0 M1 F3 L4", "xxax"},
		{"lost LAST: the next ONLY abandons and starts", "F0 M1 O3 O4", "xxax"},
		{"lost FIRST drops the message", "M1 M2 L3 O4", "...x"},
		{"lost FIRST of a later message", "O0 M2 L3 F4 L5", "x..xx"},
		{"gap before a MIDDLE abandons", "F0 M2 M3 L4 O5", "xA..x"},
		{"duplicate MIDDLE breaks the message", "F0 M1 M1 M2 L3 O4", "xxA..x"},
		{"duplicate ONLY is delivered twice", "O0 O0 O1", "xxx"},
		{"duplicate FIRST restarts the message", "F0 F0 M1 L2", "xaxx"},
		{"old FIRST after a newer message resyncs backwards", "O5 F2 L3", "xxx"},
		{"WRITE MIDDLE inside a SEND", "F0 wM1 L2 O3", "xA.x"},
		{"SEND LAST inside a WRITE", "wF0 L1 wL2 wO3", "xA.x"},
		{"MIDDLE at the expected PSN with no message", "O0 M1 L2 O3", "x..x"},
		{"wrap of the 24-bit PSN", fmt.Sprintf("F%d M%d L0 O1", bth.PSNMask-1, bth.PSNMask), "xxxx"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Receiver
			seq := parseSeq(c.seq)
			r.Reset(seq[0].psn)
			if seq[0].pos != bth.PosFirst && seq[0].pos != bth.PosOnly {
				r.Reset(0) // the lost-FIRST cases expect PSN 0
			}
			got := ""
			for _, p := range seq {
				v := r.Check(p.psn, p.op, p.pos)
				switch {
				case v.Execute && v.Abandon:
					got += "a"
				case v.Execute:
					got += "x"
				case v.Abandon:
					got += "A"
				default:
					got += "."
				}
			}
			if got != c.exec {
				t.Errorf("%s: got %q, want %q", c.seq, got, c.exec)
			}
		})
	}
}

// TestFail: an accepted packet whose execution fails (no receive WQE, a
// bad R_Key) drops the rest of its message; the next FIRST or ONLY
// starts again.
func TestFail(t *testing.T) {
	var r Receiver
	r.Reset(10)
	if v := r.Check(10, bth.OpWrite, bth.PosFirst); !v.Execute {
		t.Fatal("FIRST not executed")
	}
	r.Fail()
	if !r.Dropping() || r.Open() != None {
		t.Fatalf("after Fail: dropping=%v open=%v", r.Dropping(), r.Open())
	}
	if v := r.Check(11, bth.OpWrite, bth.PosMiddle); v.Execute || v.Why != Dropping || v.Abandon {
		t.Fatalf("MIDDLE after a failed FIRST: %+v", v)
	}
	if v := r.Check(12, bth.OpWrite, bth.PosLast); v.Execute {
		t.Fatalf("LAST after a failed FIRST: %+v", v)
	}
	if v := r.Check(13, bth.OpSend, bth.PosOnly); !v.Execute || v.Abandon {
		t.Fatalf("ONLY after a dropped message: %+v", v)
	}
	if r.ExpectedPSN() != 14 {
		t.Fatalf("expects %d", r.ExpectedPSN())
	}
}

func TestCheckPost(t *testing.T) {
	ok := map[wr.Opcode]bool{wr.Send: true, wr.SendWithImm: true, wr.RDMAWrite: true, wr.RDMAWriteWithImm: true,
		wr.BindMW: true, wr.LocalInv: true}
	for op := wr.Opcode(0); op < 64; op++ {
		if !op.Known() {
			continue
		}
		err := CheckPost(op)
		if (err == nil) != ok[op] {
			t.Errorf("CheckPost(%v) = %v", op, err)
		}
		if err != nil && !strings.Contains(err.Error(), "UC") {
			t.Errorf("CheckPost(%v) error does not say why: %v", op, err)
		}
	}
}

func TestOpcode(t *testing.T) {
	for _, rc := range []bth.Opcode{bth.RCSendFirst, bth.RCSendMiddle, bth.RCSendLast, bth.RCSendLastImm, bth.RCSendOnly,
		bth.RCSendOnlyImm, bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteLast, bth.RCWriteLastImm, bth.RCWriteOnly, bth.RCWriteOnlyImm} {
		u := Opcode(rc)
		ui, ri := u.Info(), rc.Info()
		if !ui.Valid || ui.Transport != bth.TransportUC || ui.Op != ri.Op || ui.Pos != ri.Pos || ui.Imm != ri.Imm || ui.Headers != ri.Headers {
			t.Errorf("Opcode(%v) = %v (%+v)", rc, u, *ui)
		}
	}
}

func TestNames(t *testing.T) {
	for _, m := range []Message{None, Send, Write, 9} {
		if m.String() == "" {
			t.Errorf("Message %d has no name", m)
		}
	}
	for r := Accepted; r <= NotRequest+1; r++ {
		if r.String() == "" {
			t.Errorf("Reason %d has no name", r)
		}
	}
}
