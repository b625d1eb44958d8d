// Package perftest speaks the out-of-band TCP protocol of perftest's
// bandwidth tools (ib_write_bw, ib_read_bw, ib_atomic_bw, ib_send_bw;
// perftest 4.5-0.17, which announces itself as version "6.06") and does
// the RDMA traffic those tools expect, so that softroce and perftest interoperate
// with softroce as the TCP listener ("server") or connector ("client").
//
// The exchange (docs/conformance-catalogue.md, section C) is a fixed sequence of
// exact-size messages: version, system data (cycle buffer, cache line),
// MTU, the 108-byte KEYS message (LID, out_reads, QPN, PSN, rkey, vaddr,
// GID, SRQN) twice, a barrier after RTR, a barrier when the traffic is
// over, five report values, a last barrier and "done". In every exchange
// the connector writes first and the listener reads first.
//
// As in perftest's one-way tests, the connector is the active side: it
// posts the RDMA WRITEs, READs, atomics or SENDs; the listener exposes a
// buffer (or posts receives, for SEND) and prints the numbers the active
// side reports (for SEND, the ones it measured itself). With Duplex (-b)
// both sides do both. Several QPs (-q) exchange one KEYS message each.
//
// With RDMACM (-R) the same exchange runs over rdma_cm instead (see
// rdmacm.go): an RC connection for the messages, one more per test QP.
// With Conn UD (-c UD, send only) the QPs are UD with perftest's Q_Key
// and the receives leave room for the GRH.
//
// With Latency the exchange and traffic are those of the latency tools
// (ib_write_lat, ib_read_lat, ib_atomic_lat, ib_send_lat; see lat.go).
//
// perftest 4.5 checks no data, so Run checks what it can see: the bytes
// the peer wrote into softroce's buffer, an extra READ against the timed
// ones, the sequence of fetched atomic values (see Result.Checked).
package perftest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/softroce/softroce/verbs"
)

// Version is the protocol version softroce announces. perftest rejects a
// peer below 5.70; newer perftest (6.28 and later) adds a negotiation step
// only when both sides announce at least 6.28, so "6.06" keeps every
// perftest on the protocol implemented here.
const Version = "6.06"

// DefaultPort is perftest's TCP port.
const DefaultPort = 18515

// Sizes of the fixed messages.
const (
	VersionLen = 16  // NUL-padded ASCII version
	KeysLen    = 108 // GID form of the KEYS message, NUL included
	MTULen     = 2   // one ASCII digit (enum ibv_mtu) and NUL (peer version >= 5.31)
	DoneLen    = 5   // "done" and NUL
)

// minPeerVersion is the oldest peer perftest itself accepts.
const minPeerVersion = 5.70

// ErrMalformed is wrapped by every error about a peer message that does
// not follow the protocol.
var ErrMalformed = errors.New("perftest: malformed message")

// Keys is one side's KEYS message: what the peer needs to connect to one
// QP and to reach its buffer.
type Keys struct {
	LID      uint16 // 0 on RoCE
	OutReads uint16 // outstanding READ/atomic depth this side accepts (1 for write)
	QPN      uint32 // 24 bits
	PSN      uint32 // 24 bits
	RKey     uint32
	VAddr    uint64 // absolute virtual address of the buffer
	GID      verbs.GID
	SRQN     uint32 // 0 unless XRC/DC
}

// Marshal formats k as perftest's GID-form KEYS message: lowercase hex
// fields separated by ':', a trailing ':' and a NUL, KeysLen bytes.
func (k Keys) Marshal() []byte {
	b := make([]byte, 0, KeysLen)
	b = appendHex(b, uint64(k.LID), 4)
	b = appendHex(b, uint64(k.OutReads), 4)
	b = appendHex(b, uint64(k.QPN&0xffffff), 6)
	b = appendHex(b, uint64(k.PSN&0xffffff), 6)
	b = appendHex(b, uint64(k.RKey), 8)
	b = appendHex(b, k.VAddr, 16)
	for _, g := range k.GID {
		b = appendHex(b, uint64(g), 2)
	}
	b = appendHex(b, uint64(k.SRQN), 8)
	return append(b, 0)
}

func appendHex(b []byte, v uint64, width int) []byte {
	s := strconv.FormatUint(v, 16)
	for i := len(s); i < width; i++ {
		b = append(b, '0')
	}
	b = append(b, s...)
	return append(b, ':')
}

// ParseKeys parses a GID-form KEYS message. Like perftest it reads the
// fields as colon-separated hex numbers, but it insists on all 23 fields
// being present and in range.
func ParseKeys(b []byte) (Keys, error) {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 23 {
		return Keys{}, fmt.Errorf("%w: KEYS %q has %d fields, want 23", ErrMalformed, s, len(f))
	}
	var v [23]uint64
	widths := [23]int{16, 16, 24, 24, 32, 64}
	for i := range v {
		bits := widths[i]
		switch {
		case i >= 6 && i < 22:
			bits = 8
		case i == 22:
			bits = 32
		}
		n, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			return Keys{}, fmt.Errorf("%w: KEYS %q field %d: %v", ErrMalformed, s, i, err)
		}
		v[i] = n
	}
	k := Keys{LID: uint16(v[0]), OutReads: uint16(v[1]), QPN: uint32(v[2]), PSN: uint32(v[3]),
		RKey: uint32(v[4]), VAddr: v[5], SRQN: uint32(v[22])}
	for i := range k.GID {
		k.GID[i] = byte(v[6+i])
	}
	return k, nil
}

// MarshalVersion is the VERSION message for v.
func MarshalVersion(v string) []byte {
	b := make([]byte, VersionLen)
	copy(b[:VersionLen-1], v)
	return b
}

// ParseVersion reads a peer's VERSION message and checks it is one
// perftest 6.06 talks to (at least 5.70).
func ParseVersion(b []byte) (string, error) {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return s, fmt.Errorf("%w: version %q", ErrMalformed, s)
	}
	if v < minPeerVersion {
		return s, fmt.Errorf("perftest: peer version %s is older than %.2f, which perftest no longer speaks to", s, minPeerVersion)
	}
	return s, nil
}

// mtuEnum maps a path MTU in bytes to enum ibv_mtu (1=256 .. 5=4096).
func mtuEnum(mtu int) (int, error) {
	for e, m := 1, 256; m <= 4096; e, m = e+1, m*2 {
		if m == mtu {
			return e, nil
		}
	}
	return 0, fmt.Errorf("perftest: MTU %d is not one of 256, 512, 1024, 2048, 4096", mtu)
}

// MarshalMTU is the 2-byte MTU message for mtu bytes.
func MarshalMTU(mtu int) ([]byte, error) {
	e, err := mtuEnum(mtu)
	if err != nil {
		return nil, err
	}
	return []byte{byte('0' + e), 0}, nil
}

// ParseMTU returns the MTU in bytes a peer announced, or 0 when it is not
// a valid enum ibv_mtu (perftest then keeps its own).
func ParseMTU(b []byte) int {
	if len(b) < 1 || b[0] < '1' || b[0] > '5' {
		return 0
	}
	return 128 << (b[0] - '0')
}

// Report is the result the active side sends at the end (perftest's
// struct bw_report_data, the part exchanged without --report-per-port).
type Report struct {
	Size    uint64  // message size in bytes
	Iters   uint64  // iterations over all QPs
	PeakBW  float64 // MiB/s (Gbit/s with --report_gbits)
	AvgBW   float64 // MiB/s (Gbit/s with --report_gbits)
	MsgRate float64 // million messages per second
}

// reportFields returns the five 8-byte big-endian values exchanged one by
// one (version >= 5.33 sends iters as 64 bits).
func (r Report) fields() [5][8]byte {
	var f [5][8]byte
	binary.BigEndian.PutUint64(f[0][:], r.Size)
	binary.BigEndian.PutUint64(f[1][:], r.Iters)
	binary.BigEndian.PutUint64(f[2][:], math.Float64bits(r.PeakBW))
	binary.BigEndian.PutUint64(f[3][:], math.Float64bits(r.AvgBW))
	binary.BigEndian.PutUint64(f[4][:], math.Float64bits(r.MsgRate))
	return f
}

func reportFromFields(f [5][8]byte) Report {
	return Report{
		Size:    binary.BigEndian.Uint64(f[0][:]),
		Iters:   binary.BigEndian.Uint64(f[1][:]),
		PeakBW:  math.Float64frombits(binary.BigEndian.Uint64(f[2][:])),
		AvgBW:   math.Float64frombits(binary.BigEndian.Uint64(f[3][:])),
		MsgRate: math.Float64frombits(binary.BigEndian.Uint64(f[4][:])),
	}
}

// BinaryKeysLen is the size of the KEYS message perftest sends over an
// rdma_cm exchange (-R): its struct pingpong_dest as laid out on x86-64,
// every integer big-endian (lid, out_reads, qpn, psn, rkey as 32 bits, 4
// bytes of padding, the 64-bit vaddr, the 16-byte GID, srqn, gid_index).
// It is also the size of every receive perftest posts on that exchange,
// so no message there is longer.
const BinaryKeysLen = 56

// MarshalBinary formats k as the binary KEYS message of the rdma_cm
// exchange, announcing GID index gidIndex.
func (k Keys) MarshalBinary(gidIndex int) []byte {
	b := make([]byte, BinaryKeysLen)
	binary.BigEndian.PutUint32(b[0:], uint32(k.LID))
	binary.BigEndian.PutUint32(b[4:], uint32(k.OutReads))
	binary.BigEndian.PutUint32(b[8:], k.QPN&0xffffff)
	binary.BigEndian.PutUint32(b[12:], k.PSN&0xffffff)
	binary.BigEndian.PutUint32(b[16:], k.RKey)
	binary.BigEndian.PutUint64(b[24:], k.VAddr)
	copy(b[32:48], k.GID[:])
	binary.BigEndian.PutUint32(b[48:], k.SRQN)
	binary.BigEndian.PutUint32(b[52:], uint32(int32(gidIndex)))
	return b
}

// ParseBinaryKeys parses a binary KEYS message. perftest reads lid,
// out_reads, qpn, psn, rkey, vaddr and the GID of it (the padding is
// uninitialised memory); values that do not fit their fields are
// malformed.
func ParseBinaryKeys(b []byte) (Keys, error) {
	if len(b) != BinaryKeysLen {
		return Keys{}, fmt.Errorf("%w: binary KEYS of %d bytes, want %d", ErrMalformed, len(b), BinaryKeysLen)
	}
	lid, out := binary.BigEndian.Uint32(b[0:]), binary.BigEndian.Uint32(b[4:])
	qpn, psn := binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:])
	if lid > 0xffff || out > 0xffff || qpn > 0xffffff || psn > 0xffffff {
		return Keys{}, fmt.Errorf("%w: binary KEYS lid %#x out_reads %#x qpn %#x psn %#x out of range", ErrMalformed, lid, out, qpn, psn)
	}
	k := Keys{LID: uint16(lid), OutReads: uint16(out), QPN: qpn, PSN: psn,
		RKey: binary.BigEndian.Uint32(b[16:]), VAddr: binary.BigEndian.Uint64(b[24:]), SRQN: binary.BigEndian.Uint32(b[48:])}
	copy(k.GID[:], b[32:48])
	return k, nil
}
