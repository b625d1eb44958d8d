package inspect

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// matchFrames runs the analysis over every record of a committed capture,
// as softroce inspect does, and returns the frame numbers expr selects.
func matchFrames(t *testing.T, path, expr string) []int {
	t.Helper()
	f, err := ParseFilter(expr)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	recs, err := Records(path)
	if err != nil {
		t.Fatal(err)
	}
	z := NewSummarizer(path)
	var got []int
	for i := range recs {
		m := z.AddMark(&recs[i])
		if f.Match(&recs[i], m) {
			got = append(got, recs[i].Frame)
		}
	}
	return got
}

func TestFilterSynthetic(t *testing.T) {
	// synthetic.pcapng (synthetic.txt shows it decoded): frames 1-12 are
	// RoCE, frame 13 is not.
	const path = "testdata/synthetic.pcapng"
	cases := []struct {
		expr string
		want []int
	}{
		{"qp == 0x11", []int{4, 6, 7, 11}},
		{"qp == 17", []int{4, 6, 7, 11}},
		{"dest_qp != 0x22", []int{4, 6, 7, 11, 12}},
		{"!(qp == 0x22)", []int{4, 6, 7, 11, 12}},
		{"opcode == RDMA_WRITE_MIDDLE", []int{9}},
		{`opcode == "RC SEND_ONLY"`, []int{5}},
		{"opcode == rc_send_only", []int{5}},
		{"opcode == SEND_ONLY_WITH_IMMEDIATE", []int{12}}, // UD's
		{"opcode == 0x81", []int{11}},
		{"opcode != ACKNOWLEDGE && qp == 0x11", []int{4, 11}},
		{"write", []int{1, 8, 9, 10}},
		{"opcode == write", []int{1, 8, 9, 10}},
		{"send", []int{2, 5, 12}},
		{"atomic", []int{3, 4}},
		{"ack", []int{4}},
		{"nak", []int{7}},
		{"rnr_nak", []int{6}},
		{"nak || rnr", []int{6, 7}},
		{"cnp", []int{11}},
		{"becn", []int{11}},
		{"ud", []int{12}},
		{"rocev1", []int{2}},
		{"vlan == 100", []int{3, 4}},
		{"psn >= 11 && psn <= 13", []int{3, 4, 5, 6, 7, 8}},
		{"psn > 12 and psn < 15", []int{8, 9}},
		{"src == 192.0.2.2", []int{4, 6, 7, 11}},
		{"ip.dst == 192.0.2.2 && !write", []int{3, 5, 12}},
		{"addr == 2001:db8::1", []int{1, 2}},
		{"dst == 2001:db8::/32", []int{1, 2}},
		{"src == 192.0.2.0/24 && len == 0", []int{3, 4, 5, 6, 7}},
		{"icrc_bad || truncated", []int{8, 10}},
		{"srcqp == 0x44", []int{12}},
		{"rkey == 7 && dmalen >= 1024", []int{8}},
		{"msn == 4", []int{4, 6, 7}},
		{"frame <= 2 || frame == 13", []int{1, 2}}, // frame 13 is not RoCE
		{"(qp == 0x11 || qp == 0x22) && (nak || opcode == COMPARE_SWAP)", []int{3, 7}},
		{"retransmission", nil},
		{"!!cnp", []int{11}},
		{"not cnp && qp eq 0x11", []int{4, 6, 7}},
	}
	for _, c := range cases {
		if got := matchFrames(t, path, c.expr); !slices.Equal(got, c.want) {
			t.Errorf("%s: frames %v, want %v", c.expr, got, c.want)
		}
	}
}

func TestFilterRetransmissionAndGap(t *testing.T) {
	// demo-read-loss.pcap: READ_RESPONSE_MIDDLE 105 was lost, so the
	// LAST at 106 (frame 9) follows a gap; the READ asked again at 105
	// (frame 10) and its responses (11, 12) are retransmissions.
	const path = "testdata/demo-read-loss.pcap"
	for _, c := range []struct {
		expr string
		want []int
	}{
		{"retransmission", []int{10, 11, 12}},
		{"gap", []int{9}},
		{"read && !retransmission", []int{7, 8, 9}},
		{"retrans && request", []int{10}},
		{"opcode == RDMA_READ_RESPONSE_LAST", []int{9, 12}},
	} {
		if got := matchFrames(t, path, c.expr); !slices.Equal(got, c.want) {
			t.Errorf("%s: frames %v, want %v", c.expr, got, c.want)
		}
	}
}

func TestFilterRxeNAKs(t *testing.T) {
	// A capture of kernel rdma_rxe: a PSN sequence error NAK, an RNR NAK
	// and a remote access error NAK, all to QP 0x0abcde.
	got := matchFrames(t, "../icrc/testdata/rxe/rxe-ipv4.pcap", "nak || rnr_nak")
	if !slices.Equal(got, []int{38, 40, 42}) {
		t.Errorf("frames %v, want [38 40 42]", got)
	}
	if got := matchFrames(t, "../icrc/testdata/rxe/rxe-ipv4.pcap", "nak && qp == 0x0abcde && syndrome == 0x62"); !slices.Equal(got, []int{42}) {
		t.Errorf("remote access error (syndrome 0x62): frames %v, want [42]", got)
	}
}

func TestFilterErrors(t *testing.T) {
	cases := []struct {
		expr string
		pos  int    // 0-based byte offset
		msg  string // in the message
	}{
		{"", 0, "empty expression"},
		{"qp == ", 6, "expected a value after qp =="},
		{"qp = 1", 3, "expected =="},
		{"qp == 1 & nak", 8, "expected &&"},
		{"qp", 2, "expected a comparison after qp"},
		{"qpx == 1", 0, `unknown field "qpx"`},
		{"(qp == 1", 8, "expected ) to close the ( at column 1"},
		{"qp == 1)", 7, "a ) that closes nothing"},
		{"qp == 1 nak", 8, `expected &&, || or the end of the expression, found "nak"`},
		{"psn >= x12", 7, "expected a number"},
		{"opcode == FOO", 10, "unknown opcode"},
		{"opcode < SEND_ONLY", 7, "== or != only"},
		{"src == 10.0.0.300", 7, "expected an IP address"},
		{"src > 10.0.0.1", 4, "== or != only"},
		{"nak == 1", 4, "use it bare"},
		{`opcode == "RC SEND`, 10, `closing "`},
		{"qp == 1 && ", 11, "expected a field, ( or !"},
		{"qp == 1 $", 8, "unexpected character"},
		{"&& nak", 0, "expected a field"},
		{strings.Repeat("(", 100) + "nak" + strings.Repeat(")", 100), maxDepth, "nested deeper"},
		{strings.Repeat("!", 100) + "nak", maxDepth, "nested deeper"},
		{strings.Repeat("nak || ", MaxFilterLen), MaxFilterLen, "longer than"},
	}
	for _, c := range cases {
		_, err := ParseFilter(c.expr)
		var fe *FilterError
		if !errors.As(err, &fe) {
			t.Errorf("%.40q: error %v, want a *FilterError", c.expr, err)
			continue
		}
		if fe.Pos != c.pos || !strings.Contains(fe.Msg, c.msg) {
			t.Errorf("%.40q: at %d %q, want at %d a message with %q", c.expr, fe.Pos, fe.Msg, c.pos, c.msg)
		}
		if !strings.HasPrefix(err.Error(), "filter: column ") {
			t.Errorf("%.40q: %q does not name the column", c.expr, err)
		}
		caret := fe.Caret()
		if lines := strings.Split(caret, "\n"); len(lines) != 2 || !strings.HasSuffix(lines[1], "^") {
			t.Errorf("%.40q: caret %q", c.expr, caret)
		}
	}
}

// FuzzFilter: any expression compiles or fails with a *FilterError whose
// position lies in the expression, without panic; one that compiles
// evaluates on every record of a committed capture.
func FuzzFilter(f *testing.F) {
	recs, err := Records("testdata/synthetic.pcapng")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("qp == 0x11 && (nak || retransmission)")
	f.Fuzz(func(t *testing.T, expr string) {
		flt, err := ParseFilter(expr)
		if err != nil {
			var fe *FilterError
			if !errors.As(err, &fe) {
				t.Fatalf("%q: %T %v", expr, err, err)
			}
			if fe.Pos < 0 || fe.Pos > len(expr) {
				t.Fatalf("%q: position %d outside the expression", expr, fe.Pos)
			}
			_ = fe.Caret()
			return
		}
		if flt.String() != expr {
			t.Fatalf("String %q, want %q", flt.String(), expr)
		}
		z := NewSummarizer("")
		for i := range recs {
			flt.Match(&recs[i], z.AddMark(&recs[i]))
		}
	})
}

// TestFilterMatchAllocs: matching allocates nothing per packet.
func TestFilterMatchAllocs(t *testing.T) {
	recs, err := Records("testdata/synthetic.pcapng")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseFilter(`(qp == 0x11 || src == 192.0.2.0/24) && !(opcode == "RC SEND_ONLY" || read) && psn <= 100 || retransmission || nak`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		for i := range recs {
			if f.Match(&recs[i], Mark{Retransmission: i == 3}) {
				n++
			}
		}
	})
	if allocs != 0 || n == 0 {
		t.Errorf("%v allocations per pass over %d records, %d matches", allocs, len(recs), n)
	}
}
