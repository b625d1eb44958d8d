package inspect

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gopacket/gopacket/layers"
)

// ProcessOptions tune Process.
type ProcessOptions struct {
	// Jobs is the number of goroutines decoding and rendering; 0 or 1
	// does both on the calling goroutine.
	Jobs int
	// File, when set, is copied into every record's File field.
	File string
	// Render, when set, appends a record's output to dst. It runs on the
	// decoding goroutines, several at once, so it must only read r.
	Render func(dst []byte, r *Record) ([]byte, error)
}

// Process decodes every frame of the capture at path and calls fn for
// each, in frame order, with what Render made of it (or the error Render
// returned). Frames are decoded in batches, in parallel when o.Jobs > 1;
// fn always runs on the calling goroutine. The record and out are valid
// only during the call: their storage is reused (Record.Clone keeps one).
// Process stops at the first error fn returns and returns it; read errors
// come as Walk gives them, after the frames before them.
func Process(path string, o ProcessOptions, fn func(r *Record, out []byte, renderErr error) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open capture: %w", err)
	}
	defer f.Close()
	src, err := newFrameSource(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	deliver := func(b *batch) error {
		out := 0
		for i := range b.recs {
			var rerr error
			if b.renderErrs != nil {
				rerr = b.renderErrs[i]
			}
			if err := fn(&b.recs[i], b.out[out:b.ends[i]], rerr); err != nil {
				return err
			}
			out = b.ends[i]
		}
		if b.err != nil && b.err != io.EOF {
			return fmt.Errorf("%s: %w", path, b.err)
		}
		return nil
	}
	if o.Jobs <= 1 {
		b := newBatch()
		for {
			src.fill(b)
			b.decode(&o)
			if err := deliver(b); err != nil || b.err != nil {
				return err
			}
		}
	}
	return processParallel(src, &o, deliver)
}

// maxBatches bounds the batches in flight, whatever the number of jobs:
// each holds a few MiB.
const maxBatches = 34

// processParallel runs one reader goroutine filling batches, o.Jobs
// workers decoding them, and delivers them on the calling goroutine in the
// order they were read. At most n batches exist (made as the reading gets
// ahead), which bounds the memory and makes every channel send below
// non-blocking.
func processParallel(src frameSource, o *ProcessOptions, deliver func(*batch) error) error {
	n := min(2*o.Jobs+2, maxBatches)
	free := make(chan *batch, n)
	work := make(chan *batch, n)
	order := make(chan *batch, n)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(work)
		defer close(order)
		made := 0
		for {
			var b *batch
			select {
			case b = <-free:
			case <-quit:
				return
			default:
				if made < n {
					b = newBatch()
					made++
					break
				}
				select {
				case b = <-free:
				case <-quit:
					return
				}
			}
			src.fill(b)
			work <- b
			order <- b
			if b.err != nil {
				return
			}
		}
	})
	for range min(o.Jobs, n) {
		wg.Go(func() {
			for b := range work {
				b.decode(o)
				b.done <- struct{}{}
			}
		})
	}
	var err error
	for b := range order {
		<-b.done
		if err == nil {
			err = deliver(b)
			if err != nil {
				close(quit)
			}
		}
		if err == nil {
			free <- b
		}
	}
	wg.Wait()
	return err
}

// batchFrames and batchBytes bound a batch: enough frames that handing a
// batch between goroutines costs little per frame, few enough that a
// handful in flight stay small. Tests shrink them.
var (
	batchFrames = 2048
	batchBytes  = 1 << 20
)

// frameMeta is one frame of a batch, its bytes at buf[off:off+n].
type frameMeta struct {
	off, n int
	ts     time.Time
	wire   int
	iface  int
	lt     layers.LinkType
}

// batch is a run of consecutive frames, their records and their output.
type batch struct {
	first  int // frame number of frames[0]
	buf    []byte
	frames []frameMeta
	err    error // what ended the reading after these frames: io.EOF or a read error

	recs       []Record
	stores     []headerStore
	out        []byte
	ends       []int // ends[i] is where record i's output ends in out
	renderErrs []error
	done       chan struct{}
}

func newBatch() *batch {
	return &batch{buf: make([]byte, 0, batchBytes), frames: make([]frameMeta, 0, batchFrames), done: make(chan struct{}, 1)}
}

// reset empties the frames for the reader to fill.
func (b *batch) reset(first int) {
	b.first, b.buf, b.frames, b.err = first, b.buf[:0], b.frames[:0], nil
}

// decode decodes and renders every frame of the batch.
func (b *batch) decode(o *ProcessOptions) {
	n := len(b.frames)
	if cap(b.recs) < n {
		b.recs = make([]Record, n)
		b.stores = make([]headerStore, n)
	}
	b.recs, b.stores = b.recs[:n], b.stores[:n]
	b.out, b.ends, b.renderErrs = b.out[:0], slices.Grow(b.ends[:0], n), nil
	for i := range b.frames {
		f := &b.frames[i]
		r := &b.recs[i]
		decodeLink(r, &b.stores[i], f.lt, b.buf[f.off:f.off+f.n:f.off+f.n], f.ts, f.wire, f.iface)
		r.Frame, r.File = b.first+i, o.File
		if o.Render != nil {
			out, err := o.Render(b.out, r)
			if err != nil {
				if b.renderErrs == nil {
					b.renderErrs = make([]error, n)
				}
				b.renderErrs[i] = err
			} else {
				b.out = out
			}
		}
		b.ends = append(b.ends, len(b.out))
	}
}

// RenderJSON renders a RoCE record as a JSON line (WriteJSON's bytes), for
// ProcessOptions.Render.
func RenderJSON(dst []byte, r *Record) ([]byte, error) {
	if !r.RoCE {
		return dst, nil
	}
	b, err := AppendJSON(dst, r)
	if err != nil {
		return dst, err
	}
	return append(b, '\n'), nil
}

// RenderText returns a ProcessOptions.Render giving WriteText's bytes.
func RenderText(verbose bool) func(dst []byte, r *Record) ([]byte, error) {
	return func(dst []byte, r *Record) ([]byte, error) {
		if !r.RoCE {
			return dst, nil
		}
		dst = append(dst, Line(r)...)
		dst = append(dst, '\n')
		if verbose {
			for _, f := range Fields(r) {
				dst = append(dst, "      "...)
				dst = append(dst, f.String()...)
				dst = append(dst, '\n')
			}
		}
		return dst, nil
	}
}

// Clone returns a copy of r that shares no storage with it, for keeping a
// record Process hands out beyond the call.
func (r *Record) Clone() Record {
	c := *r
	st := new(headerStore)
	c.RDETH = keep(&st.rdeth, r.RDETH)
	c.DETH = keep(&st.deth, r.DETH)
	c.XRCETH = keep(&st.xrceth, r.XRCETH)
	c.FETH = keep(&st.feth, r.FETH)
	c.RETH = keep(&st.reth, r.RETH)
	c.AtomicETH = keep(&st.atomicETH, r.AtomicETH)
	c.AETH = keep(&st.aeth, r.AETH)
	if a := c.AETH; a != nil {
		a.Credits = keep(&st.credits, a.Credits)
		a.RNRTimer = keep(&st.rnrTimer, a.RNRTimer)
		a.RNRTimerUS = keep(&st.rnrUS, a.RNRTimerUS)
		a.NAKCode = keep(&st.nakCode, a.NAKCode)
	}
	c.AtomicAck = keep(&st.atomicAck, r.AtomicAck)
	c.Imm = keep(&st.imm, r.Imm)
	c.IETH = keep(&st.ieth, r.IETH)
	// A CM is made for its record alone and never changed.
	c.VLAN = slices.Clone(r.VLAN)
	c.Data = bytes.Clone(r.Data)
	return c
}

// keep copies *src into *dst and returns dst, or nil when src is nil.
func keep[T any](dst, src *T) *T {
	if src == nil {
		return nil
	}
	*dst = *src
	return dst
}
