package inspect

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// tsharkFields are the Wireshark fields compared with our decoding
// (names as listed by `tshark -G fields`, Wireshark 4.0).
var tsharkFields = []string{"frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
	"infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
	"infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt", "infiniband.atomicacketh.origremdt",
	"infiniband.deth.q_key", "infiniband.deth.srcqp", "infiniband.immdt", "infiniband.ieth"}

// TestAgainstTshark decodes every shared capture with tshark and with
// package inspect and requires the same opcode, destination QP, PSN, RETH
// and AETH fields for every frame, and the same opcode counts. Wireshark
// decodes UDP port 4791 as RoCEv2 and EtherType 0x8915 as RoCEv1 by
// default. The project's own synthetic capture (IPv6, RoCEv1, VLAN,
// atomics, immediate data, invalidate, UD) is compared too.
func TestAgainstTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt-get install tshark); skipping the Wireshark comparison")
	}
	files := []string{syntheticCapture}
	if shared, _ := filepath.Glob(sharedDir + "/*/*.pcap"); len(shared) > 0 {
		files = append(files, shared...)
	} else {
		t.Log("shared captures not available: comparing the synthetic capture only")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Parallel() // tshark's start-up dominates
			rows := runTshark(t, tshark, path, tsharkFields)
			recs, err := Records(path)
			if err != nil {
				t.Fatal(err)
			}
			theirs := map[string]int{}
			ours := map[string]int{}
			for _, cols := range rows {
				n, err := strconv.Atoi(cols[0])
				if err != nil || n < 1 || n > len(recs) {
					t.Fatalf("tshark frame number %q (we have %d frames)", cols[0], len(recs))
				}
				r := &recs[n-1]
				if cols[1] == "" {
					if r.RoCE {
						t.Errorf("frame %d: tshark sees no BTH, we decode %s", n, r.OpcodeName)
					}
					continue
				}
				theirs[cols[1]]++
				if !r.RoCE {
					t.Errorf("frame %d: tshark decodes opcode %s, we see no RoCE", n, cols[1])
					continue
				}
				ours[strconv.Itoa(int(r.Opcode))]++
				want := ourFields(r)
				for i := 1; i < len(cols); i++ {
					if !sameValue(cols[i], want[i]) {
						t.Errorf("frame %d %s: tshark %q, ours %q", n, tsharkFields[i], cols[i], want[i])
					}
				}
			}
			if len(rows) != len(recs) {
				t.Errorf("tshark listed %d frames, we read %d", len(rows), len(recs))
			}
			if len(theirs) == 0 {
				t.Errorf("tshark decoded no BTH at all: is UDP 4791 still dissected as RoCEv2?")
			}
			if fmt.Sprint(theirs) != fmt.Sprint(ours) {
				t.Errorf("opcode counts: tshark %v, ours %v", theirs, ours)
			}
			t.Logf("%d frames, opcode counts agree: %v", len(recs), ours)
		})
	}
}

// ourFields renders a record as the tshark columns.
func ourFields(r *Record) []string {
	c := make([]string, len(tsharkFields))
	c[1] = strconv.Itoa(int(r.Opcode))
	c[2] = fmt.Sprintf("0x%06x", r.DestQP)
	c[3] = strconv.Itoa(int(r.PSN))
	if h := r.RETH; h != nil {
		c[4] = fmt.Sprintf("0x%016x", h.VA)
		c[5] = fmt.Sprintf("0x%08x", h.RKey)
		c[6] = strconv.Itoa(int(h.DMALen))
	}
	if h := r.AtomicETH; h != nil {
		// Wireshark shows the AtomicETH address and key as RETH fields.
		c[4] = fmt.Sprintf("0x%016x", h.VA)
		c[5] = fmt.Sprintf("0x%08x", h.RKey)
		c[9] = strconv.FormatUint(h.SwapAdd, 10)
		c[10] = strconv.FormatUint(h.Compare, 10)
	}
	if h := r.AETH; h != nil {
		c[7] = strconv.Itoa(int(h.Syndrome))
		c[8] = strconv.Itoa(int(h.MSN))
	}
	if h := r.AtomicAck; h != nil {
		c[11] = strconv.FormatUint(h.Orig, 10)
	}
	if h := r.DETH; h != nil {
		c[12] = strconv.Itoa(int(h.QKey))
		c[13] = strconv.Itoa(int(h.SrcQP))
	}
	if r.Imm != nil {
		c[14] = fmt.Sprintf("%08x", *r.Imm)
	}
	if h := r.IETH; h != nil {
		c[15] = fmt.Sprintf("%08x", h.RKey)
	}
	return c
}

// sameValue compares a tshark column with ours numerically when both
// parse as numbers (tshark's hex/decimal choice varies by field).
func sameValue(theirs, ours string) bool {
	if theirs == ours {
		return true
	}
	a, err1 := strconv.ParseUint(theirs, 0, 64)
	b, err2 := strconv.ParseUint(ours, 0, 64)
	return err1 == nil && err2 == nil && a == b
}
