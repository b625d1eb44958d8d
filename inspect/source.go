package inspect

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"github.com/gopacket/gopacket/layers"
)

// frameSource fills batches with the frames of a capture, in order.
type frameSource interface {
	// fill resets b and reads frames into it; b.err is set when reading
	// ended after them (io.EOF at the end of the capture).
	fill(b *batch)
}

// Classic pcap magic numbers, as read little-endian (pcap-savefile(5)).
const (
	pcapMagicMicro     = 0xa1b2c3d4
	pcapMagicNano      = 0xa1b23c4d
	pcapMagicMicroSwap = 0xd4c3b2a1
	pcapMagicNanoSwap  = 0x4d3cb2a1
	// pcapEagerMax is the longest record pcapgo reads whatever the snap
	// length says (libpcap's MAXIMUM_SNAPLEN).
	pcapEagerMax = 262144
)

// newFrameSource reads the capture's header from r. A classic pcap gets
// the fast reader below, which reads the file in large blocks and slices
// frames out of them; anything else (pcapng, gzip, odd versions) goes
// through NewReader, so that both paths give the same frames and errors.
func newFrameSource(r io.Reader) (frameSource, error) {
	hdr := make([]byte, 24)
	n, _ := io.ReadFull(r, hdr)
	if s := newPcapSource(hdr[:n], r); s != nil {
		return s, nil
	}
	rd, err := NewReader(io.MultiReader(bytes.NewReader(hdr[:n]), r))
	if err != nil {
		return nil, err
	}
	return &readerSource{rd: rd}, nil
}

// pcapSource reads a classic pcap file the way pcapgo.Reader does,
// without a copy or an allocation per frame.
type pcapSource struct {
	r        io.Reader
	big      bool   // big-endian header fields
	nsFactor uint32 // 1000 for microsecond timestamps
	snaplen  uint32
	lt       layers.LinkType
	carry    []byte // the start of a record the last batch could not hold
	eof      bool   // r has no more bytes
	failed   error  // the read error that ended r, if not EOF
	frame    int    // frames read so far
}

func newPcapSource(hdr []byte, r io.Reader) *pcapSource {
	if len(hdr) < 24 {
		return nil
	}
	s := &pcapSource{r: r}
	switch binary.LittleEndian.Uint32(hdr) {
	case pcapMagicMicro:
		s.nsFactor = 1000
	case pcapMagicNano:
		s.nsFactor = 1
	case pcapMagicMicroSwap:
		s.big, s.nsFactor = true, 1000
	case pcapMagicNanoSwap:
		s.big, s.nsFactor = true, 1
	default:
		return nil
	}
	if s.u16(hdr[4:]) != 2 || s.u16(hdr[6:]) != 4 {
		return nil
	}
	s.snaplen = s.u32(hdr[16:])
	s.lt = layers.LinkType(s.u32(hdr[20:]))
	return s
}

func (s *pcapSource) u16(b []byte) uint16 {
	if s.big {
		return binary.BigEndian.Uint16(b)
	}
	return binary.LittleEndian.Uint16(b)
}

func (s *pcapSource) u32(b []byte) uint32 {
	if s.big {
		return binary.BigEndian.Uint32(b)
	}
	return binary.LittleEndian.Uint32(b)
}

// more reads into the free space of *buf, growing it by up to grow bytes
// first; it returns false once the file has no more bytes.
func (s *pcapSource) more(buf *[]byte, grow int) bool {
	if s.eof {
		return false
	}
	b := *buf
	if cap(b)-len(b) < grow {
		b = append(b[:cap(b)], make([]byte, grow)...)[:len(b)]
	}
	for len(b) < cap(b) {
		n, err := s.r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			s.eof = true
			if err != io.EOF {
				s.failed = err
			}
			break
		}
		if n == 0 {
			break
		}
	}
	*buf = b
	return true
}

func (s *pcapSource) fill(b *batch) {
	b.reset(s.frame + 1)
	b.buf = append(b.buf, s.carry...)
	s.carry = s.carry[:0]
	s.more(&b.buf, 0)
	maxCap := pcapEagerMax
	if s.snaplen > pcapEagerMax {
		maxCap = int(s.snaplen)
	}
	off := 0
	for len(b.frames) < batchFrames {
		rest := b.buf[off:]
		if len(rest) >= 16 {
			// pcapgo checks the lengths before it reads the data.
			if err := s.checkLengths(rest, maxCap); err != nil {
				b.err = err
				return
			}
		}
		if len(rest) < 16 || len(rest)-16 < int(s.u32(rest[8:])) {
			if off > 0 && !s.eof {
				break // the next batch takes it
			}
			// The first record does not fit the buffer: read on.
			need := 16
			if len(rest) >= 16 {
				need += int(s.u32(rest[8:]))
			}
			if s.more(&b.buf, min(need-len(rest), max(cap(b.buf), batchBytes))) {
				continue
			}
			// The file ends inside this record, with io.ReadFull's errors
			// (no byte at all of the header or of the data is io.EOF,
			// which pcapgo takes as the end of the capture).
			switch {
			case s.failed != nil:
				b.err = s.readErr(s.failed)
			case len(rest) == 0 || len(rest) == 16:
				b.err = io.EOF
			default:
				b.err = s.readErr(io.ErrUnexpectedEOF)
			}
			return
		}
		caplen := int(s.u32(rest[8:]))
		ts := time.Unix(int64(s.u32(rest[0:])), int64(s.u32(rest[4:])*s.nsFactor)).UTC()
		b.frames = append(b.frames, frameMeta{off: off + 16, n: caplen, ts: ts, wire: int(s.u32(rest[12:])), lt: s.lt})
		s.frame++
		off += 16 + caplen
	}
	s.carry = append(s.carry, b.buf[off:]...)
	b.buf = b.buf[:off]
}

// checkLengths applies pcapgo's checks to a record header.
func (s *pcapSource) checkLengths(h []byte, maxCap int) error {
	caplen, length := int(s.u32(h[8:])), int(s.u32(h[12:]))
	if caplen > maxCap {
		return s.readErr(fmt.Errorf("capture length exceeds snap length: %d > %d", caplen, s.snaplen))
	}
	if caplen > length {
		return s.readErr(fmt.Errorf("capture length exceeds original packet length: %d > %d", caplen, length))
	}
	return nil
}

func (s *pcapSource) readErr(err error) error {
	return fmt.Errorf("read frame %d: %w", s.frame+1, err)
}

// readerSource fills batches from a Reader (pcapng and the rest), copying
// each frame out of the reader's reused buffer.
type readerSource struct {
	rd *Reader
}

func (s *readerSource) fill(b *batch) {
	b.reset(s.rd.frame + 1)
	for len(b.frames) < batchFrames && len(b.buf) < batchBytes {
		data, ci, err := s.rd.zeroCopy()
		if err != nil {
			if err != io.EOF {
				err = fmt.Errorf("read frame %d: %w", s.rd.frame+1, err)
			}
			b.err = err
			return
		}
		s.rd.frame++
		b.frames = append(b.frames, frameMeta{off: len(b.buf), n: len(data), ts: ci.Timestamp, wire: ci.Length,
			iface: ci.InterfaceIndex, lt: s.rd.link(ci)})
		b.buf = append(b.buf, data...)
	}
}
