package bth

import (
	"fmt"
	"strings"
	"testing"
)

// validOpcodes lists every opcode IBTA vol. 1 table 41 (plus annex A17 for
// the CNP and annex A19 for FLUSH and ATOMIC WRITE) defines, with the total
// transport header length (BTH included) the spec gives it.
var validOpcodes = map[Opcode]int{
	// RC: docs/rxe-behaviour.md §1.1.
	0x00: 12, 0x01: 12, 0x02: 12, 0x03: 16, 0x04: 12, 0x05: 16, 0x06: 28, 0x07: 12, 0x08: 12, 0x09: 16,
	0x0A: 28, 0x0B: 32, 0x0C: 28, 0x0D: 16, 0x0E: 12, 0x0F: 16, 0x10: 16, 0x11: 16, 0x12: 24, 0x13: 40,
	0x14: 40, 0x16: 16, 0x17: 16, 0x1C: 32, 0x1D: 28,
	// UC: SEND and RDMA WRITE only.
	0x20: 12, 0x21: 12, 0x22: 12, 0x23: 16, 0x24: 12, 0x25: 16, 0x26: 28, 0x27: 12, 0x28: 12, 0x29: 16,
	0x2A: 28, 0x2B: 32,
	// RD: RDETH on every packet, DETH on requests; RESYNC at 0x55.
	0x40: 24, 0x41: 24, 0x42: 24, 0x43: 28, 0x44: 24, 0x45: 28, 0x46: 40, 0x47: 24, 0x48: 24, 0x49: 28,
	0x4A: 40, 0x4B: 44, 0x4C: 40, 0x4D: 20, 0x4E: 16, 0x4F: 20, 0x50: 20, 0x51: 20, 0x52: 28, 0x53: 52,
	0x54: 52, 0x55: 24,
	// UD.
	0x64: 20, 0x65: 24,
	// CNP.
	0x81: 12,
	// XRC: XRCETH on requests.
	0xA0: 16, 0xA1: 16, 0xA2: 16, 0xA3: 20, 0xA4: 16, 0xA5: 20, 0xA6: 32, 0xA7: 16, 0xA8: 16, 0xA9: 20,
	0xAA: 32, 0xAB: 36, 0xAC: 32, 0xAD: 16, 0xAE: 12, 0xAF: 16, 0xB0: 16, 0xB1: 16, 0xB2: 24, 0xB3: 44,
	0xB4: 44, 0xB6: 20, 0xB7: 20,
}

func TestOpcodeTableCoversAll256(t *testing.T) {
	if len(validOpcodes) != 85 {
		t.Fatalf("expectation table has %d rows", len(validOpcodes))
	}
	for i := range 256 {
		o := Opcode(i)
		info := o.Info()
		if info.Opcode != o {
			t.Errorf("0x%02x: row says opcode 0x%02x", i, uint8(info.Opcode))
		}
		if info.Transport != Transport(i>>5) {
			t.Errorf("0x%02x: transport %v", i, info.Transport)
		}
		wantHdr, valid := validOpcodes[o]
		if info.Valid != valid {
			t.Errorf("0x%02x %s: valid=%v, want %v", i, info.Name, info.Valid, valid)
			continue
		}
		if !valid {
			want := fmt.Sprintf("RESERVED 0x%02x", i)
			if i >= 0xC0 {
				want = fmt.Sprintf("VENDOR 0x%02x", i)
			}
			if info.Name != want {
				t.Errorf("0x%02x: name %q, want %q", i, info.Name, want)
			}
			continue
		}
		if info.HdrLen != wantHdr || info.HdrLen != BTHLen+info.Headers.Len() {
			t.Errorf("0x%02x %s: header length %d (%s), want %d", i, info.Name, info.HdrLen, info.Headers, wantHdr)
		}
		if !strings.HasPrefix(info.Name, info.Transport.String()+" ") && o != CNP {
			t.Errorf("0x%02x: name %q lacks transport prefix", i, info.Name)
		}
		if got, ok := Lookup(info.Name); !ok || got != o {
			t.Errorf("Lookup(%q) = 0x%02x, %v", info.Name, uint8(got), ok)
		}
		if o.String() != info.Name {
			t.Errorf("0x%02x: String %q", i, o.String())
		}
	}
}

func TestOpcodeRows(t *testing.T) {
	cases := []struct {
		op      Opcode
		name    string
		o       Operation
		pos     Position
		hdr     Header
		payload Payload
		request bool
	}{
		{RCSendFirst, "RC SEND_FIRST", OpSend, PosFirst, 0, PayloadPMTU, true},
		{RCSendLastImm, "RC SEND_LAST_WITH_IMMEDIATE", OpSend, PosLast, HdrImmDt, PayloadUpTo, true},
		{RCWriteOnlyImm, "RC RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpWrite, PosOnly, HdrRETH | HdrImmDt, PayloadUpTo, true},
		{RCReadRequest, "RC RDMA_READ_REQUEST", OpReadRequest, PosOnly, HdrRETH, PayloadNone, true},
		{RCReadResponseMiddle, "RC RDMA_READ_RESPONSE_MIDDLE", OpReadResponse, PosMiddle, 0, PayloadPMTU, false},
		{RCReadResponseLast, "RC RDMA_READ_RESPONSE_LAST", OpReadResponse, PosLast, HdrAETH, PayloadUpTo, false},
		{RCAck, "RC ACKNOWLEDGE", OpAck, PosNone, HdrAETH, PayloadNone, false},
		{RCAtomicAck, "RC ATOMIC_ACKNOWLEDGE", OpAtomicAck, PosNone, HdrAETH | HdrAtomicAckETH, PayloadNone, false},
		{RCCompareSwap, "RC COMPARE_SWAP", OpCompareSwap, PosOnly, HdrAtomicETH, PayloadNone, true},
		{RCSendOnlyInv, "RC SEND_ONLY_WITH_INVALIDATE", OpSend, PosOnly, HdrIETH, PayloadUpTo, true},
		{RCFlush, "RC FLUSH", OpFlush, PosOnly, HdrFETH | HdrRETH, PayloadNone, true},
		{RCAtomicWrite, "RC ATOMIC_WRITE", OpAtomicWrite, PosOnly, HdrRETH, PayloadFixed, true},
		{0x2B, "UC RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpWrite, PosOnly, HdrRETH | HdrImmDt, PayloadUpTo, true},
		{0x4D, "RD RDMA_READ_RESPONSE_FIRST", OpReadResponse, PosFirst, HdrRDETH | HdrAETH, PayloadPMTU, false},
		{0x53, "RD COMPARE_SWAP", OpCompareSwap, PosOnly, HdrRDETH | HdrDETH | HdrAtomicETH, PayloadNone, true},
		{0x55, "RD RESYNC", OpResync, PosOnly, HdrRDETH | HdrDETH, PayloadNone, true},
		{UDSendOnlyImm, "UD SEND_ONLY_WITH_IMMEDIATE", OpSend, PosOnly, HdrDETH | HdrImmDt, PayloadUpTo, true},
		{CNP, "CNP", OpCNP, PosNone, 0, PayloadFixed, false},
		{0xA6, "XRC RDMA_WRITE_FIRST", OpWrite, PosFirst, HdrXRCETH | HdrRETH, PayloadPMTU, true},
		{0xB1, "XRC ACKNOWLEDGE", OpAck, PosNone, HdrAETH, PayloadNone, false},
		{0xB7, "XRC SEND_ONLY_WITH_INVALIDATE", OpSend, PosOnly, HdrXRCETH | HdrIETH, PayloadUpTo, true},
	}
	for _, c := range cases {
		i := c.op.Info()
		if i.Name != c.name || i.Op != c.o || i.Pos != c.pos || i.Headers != c.hdr || i.Payload != c.payload || i.Request != c.request {
			t.Errorf("0x%02x: got %s %v %v %s payload %d request %v; want %s %v %v %s payload %d request %v",
				uint8(c.op), i.Name, i.Op, i.Pos, i.Headers, i.Payload, i.Request, c.name, c.o, c.pos, c.hdr, c.payload, c.request)
		}
	}
	if RCAtomicWrite.Info().FixedLen != 8 || CNP.Info().FixedLen != CNPPayloadLen {
		t.Error("fixed payload lengths")
	}
	if !RCSendLastImm.Info().Imm || !RCSendOnlyInv.Info().Inv || RCSendOnly.Info().Imm {
		t.Error("Imm/Inv flags")
	}
}

func TestSyndromes(t *testing.T) {
	cases := []struct {
		s    Syndrome
		text string
	}{
		{SyndromeACKUnlimited, "ACK (credits unlimited)"},
		{0x00, "ACK (credits 0)"},
		{0x0A, "ACK (credits 32)"},
		{RNRNAK(14), "RNR NAK (timer 14 = 1.28ms)"},
		{RNRNAK(0), "RNR NAK (timer 0 = 655.36ms)"},
		{SyndromePSNSeqError, "NAK PSN sequence error"},
		{SyndromeRemoteAccessError, "NAK remote access error"},
		{0x65, "NAK reserved NAK code 5"},
		{0x40, "reserved syndrome 0x40"},
	}
	for _, c := range cases {
		if got := c.s.String(); got != c.text {
			t.Errorf("0x%02x: %q, want %q", uint8(c.s), got, c.text)
		}
	}
	if !RNRNAK(3).IsRNRNAK() || !SyndromeInvalidRequest.IsNAK() || !Syndrome(0x1f).IsACK() || Syndrome(0x1f).Credits() != -1 {
		t.Error("syndrome predicates")
	}
}
