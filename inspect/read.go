package inspect

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// pcapngMagic is the block type of a pcapng Section Header Block.
var pcapngMagic = []byte{0x0a, 0x0d, 0x0d, 0x0a}

// Reader yields the decoded records of one pcap or pcapng file.
type Reader struct {
	next func() ([]byte, gopacket.CaptureInfo, error)
	// zeroCopy is next with the frame in a buffer the following call reuses.
	zeroCopy func() ([]byte, gopacket.CaptureInfo, error)
	link     func(ci gopacket.CaptureInfo) layers.LinkType
	frame    int
}

// NewReader detects the capture format (pcap in either byte order and
// timestamp resolution, or pcapng with any number of interfaces and link
// types) and returns a Reader over it.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(4)
	if err != nil {
		return nil, fmt.Errorf("read capture header: %w", err)
	}
	if string(magic) == string(pcapngMagic) {
		ng, err := pcapgo.NewNgReader(br, pcapgo.NgReaderOptions{WantMixedLinkType: true, SkipUnknownVersion: true})
		if err != nil {
			return nil, fmt.Errorf("open pcapng: %w", err)
		}
		first := ng.LinkType()
		return &Reader{next: ng.ReadPacketData, zeroCopy: ng.ZeroCopyReadPacketData, link: func(ci gopacket.CaptureInfo) layers.LinkType {
			// With mixed link types the reader puts each packet's first.
			if len(ci.AncillaryData) > 0 {
				if lt, ok := ci.AncillaryData[0].(layers.LinkType); ok {
					return lt
				}
			}
			return first
		}}, nil
	}
	pr, err := pcapgo.NewReader(br)
	if err != nil {
		return nil, fmt.Errorf("open pcap: %w", err)
	}
	lt := pr.LinkType()
	return &Reader{next: pr.ReadPacketData, zeroCopy: pr.ZeroCopyReadPacketData, link: func(gopacket.CaptureInfo) layers.LinkType { return lt }}, nil
}

// Next returns the next record, or io.EOF after the last one. A file cut
// in the middle of a packet record returns an error wrapping
// io.ErrUnexpectedEOF after the complete records.
func (r *Reader) Next() (Record, error) {
	data, ci, err := r.next()
	if err != nil {
		if err == io.EOF {
			return Record{}, io.EOF
		}
		return Record{}, fmt.Errorf("read frame %d: %w", r.frame+1, err)
	}
	r.frame++
	rec := DecodeLink(r.link(ci), data, ci)
	rec.Frame = r.frame
	return rec, nil
}

// Records decodes every frame of the capture file at path.
func Records(path string) ([]Record, error) {
	var recs []Record
	err := Walk(path, func(r *Record) error {
		recs = append(recs, *r)
		return nil
	})
	return recs, err
}

// Walk calls fn for every frame of the capture at path, in order, and
// stops at the first error fn returns.
func Walk(path string, fn func(*Record) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open capture: %w", err)
	}
	defer f.Close()
	rd, err := NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := fn(&rec); err != nil {
			return err
		}
	}
}
