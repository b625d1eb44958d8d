package bth

import (
	"fmt"
	"time"
)

// Syndrome is the AETH syndrome byte: bits 7-5 the type, bits 4-0 a value
// (credit count, RNR timer or NAK code), IBTA §9.3.5 table 43.
type Syndrome uint8

// Syndrome types (bits 7-5).
const (
	SynACK    = 0 // 000
	SynRNRNAK = 1 // 001
	SynNAK    = 3 // 011
)

// NAK codes (low five bits of a NAK syndrome).
const (
	NAKPSNSeqError       = 0
	NAKInvalidRequest    = 1
	NAKRemoteAccessError = 2
	NAKRemoteOpError     = 3
	NAKInvalidRDRequest  = 4
)

// Prebuilt syndromes.
const (
	SyndromeACKUnlimited      Syndrome = 0x1f // ACK, credit code 31: no flow control (what rxe sends)
	SyndromePSNSeqError       Syndrome = 0x60
	SyndromeInvalidRequest    Syndrome = 0x61
	SyndromeRemoteAccessError Syndrome = 0x62
	SyndromeRemoteOpError     Syndrome = 0x63
	SyndromeInvalidRDRequest  Syndrome = 0x64
)

// RNRNAK returns the RNR NAK syndrome carrying the encoded timer.
func RNRNAK(timer uint8) Syndrome { return Syndrome(0x20 | timer&0x1f) }

// Type is the syndrome type (SynACK, SynRNRNAK, SynNAK, or 2 = reserved).
func (s Syndrome) Type() uint8 { return uint8(s) >> 5 }

// Value is the low five bits.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1f }

// IsACK reports an ACK syndrome (type 000).
func (s Syndrome) IsACK() bool { return s.Type() == SynACK }

// IsRNRNAK reports a receiver-not-ready NAK (type 001).
func (s Syndrome) IsRNRNAK() bool { return s.Type() == SynRNRNAK }

// IsNAK reports a NAK (type 011); Value is the NAK code.
func (s Syndrome) IsNAK() bool { return s.Type() == SynNAK }

var creditTable = [31]int{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
	1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768}

// Credits decodes an ACK's credit code: -1 means the code 31 "invalid"
// (unlimited) value (IBTA §9.7.7.2.6 table 44).
func (s Syndrome) Credits() int {
	v := s.Value()
	if v == 31 {
		return -1
	}
	return creditTable[v]
}

// rnrTimerMicros is the RNR NAK timer table, IBTA §9.7.5.2.8 table 45.
var rnrTimerMicros = [32]int64{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

// RNRTimer converts an encoded RNR timer (0..31) into a duration.
func RNRTimer(code uint8) time.Duration {
	return time.Duration(rnrTimerMicros[code&0x1f]) * time.Microsecond
}

var nakNames = [5]string{"PSN sequence error", "invalid request", "remote access error",
	"remote operational error", "invalid RD request"}

// NAKName names a NAK code.
func NAKName(code uint8) string {
	if int(code) < len(nakNames) {
		return nakNames[code]
	}
	return fmt.Sprintf("reserved NAK code %d", code)
}

// String describes the syndrome the way an engineer reads it.
func (s Syndrome) String() string {
	switch s.Type() {
	case SynACK:
		if s.Value() == 31 {
			return "ACK (credits unlimited)"
		}
		return fmt.Sprintf("ACK (credits %d)", s.Credits())
	case SynRNRNAK:
		return fmt.Sprintf("RNR NAK (timer %d = %v)", s.Value(), RNRTimer(s.Value()))
	case SynNAK:
		return "NAK " + NAKName(s.Value())
	}
	return fmt.Sprintf("reserved syndrome 0x%02x", uint8(s))
}
