// Package soak runs two softroce devices over an impaired in-process pipe
// for minutes, through the public verbs API: long-lived RC QP pairs carry
// WRITE, READ, SEND and atomic traffic with every byte checked, QP pairs
// are created, used and destroyed continuously (some mid-transfer, some
// moved to ERR first), and garbage packets hit both devices. It asserts
// that no byte is corrupted, that the long-lived QPs see only successful
// completions, and that the heap after GC and the goroutine count do not
// grow (README.md).
package soak

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

var (
	flagDuration    = flag.Duration("soak.duration", 0, "how long TestSoak runs (default 1m, or $SOFTROCE_SOAK_DURATION)")
	flagSeed        = flag.Uint64("soak.seed", 0, "seed of the workload and the impairment (0: from the clock)")
	flagHeapProfile = flag.String("soak.heapprofile", "", "write the heap profiles taken at the reference point and at the end to FILE.ref and FILE.end")
)

// Rates are chosen so that a run under -race on a shared 2-core machine
// keeps up; the log reports what was achieved.
const (
	longPairs    = 4         // long-lived QP pairs: two from each device
	longMax      = 32 << 10  // largest long-lived message
	churnWorkers = 4         // goroutines creating and destroying QP pairs
	churnRate    = 200       // QP pairs per second at most, all workers together
	churnBuf     = 128 << 10 // per churned QP
	injectEvery  = 5 * time.Millisecond
	injectBatch  = 8 // garbage packets per tick and direction: 1600 a second into each device
	logEvery     = 10 * time.Second
	waitLimit    = time.Minute // a completion later than this is a hang, not slowness
	// flushLimit bounds the wait for the flush completions of a QP moved
	// to ERR: they need no packet, only the transition.
	flushLimit = 10 * time.Second
	// A destroyed pair's CQs are checked again this much later: nothing
	// may complete on a QP after ibv_destroy_qp returned.
	graveAge = 250 * time.Millisecond
	// settle lets retransmissions, ACKs and held packets drain before a
	// measurement.
	settle = 500 * time.Millisecond
	// growth is the heap and goroutine bound.
	growth = 0.10
)

const allAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic

func soakDuration(t *testing.T) time.Duration {
	if *flagDuration > 0 {
		return *flagDuration
	}
	if s := os.Getenv("SOFTROCE_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("SOFTROCE_SOAK_DURATION=%q: want a positive Go duration such as 10m", s)
		}
		return d
	}
	return time.Minute
}

// end is one side of a QP pair: a device's PD, MR, CQ and QP.
type end struct {
	dev *verbs.Device
	pd  *verbs.PD
	mr  *verbs.MR
	cq  *verbs.CQ
	qp  *verbs.QP
	buf []byte
}

func newEnd(dev *verbs.Device, size, wr, cqDepth int) (*end, error) {
	e := &end{dev: dev, buf: make([]byte, size)}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.mr, err = e.pd.RegMR(e.buf, allAccess); err != nil {
		return nil, err
	}
	if e.cq, err = dev.CreateCQ(cqDepth); err != nil {
		return nil, err
	}
	e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq,
		Cap: verbs.QPCap{MaxSendWR: wr, MaxRecvWR: wr, MaxInlineData: verbs.MaxInline}})
	return e, err
}

func (e *end) sge(off, n int) []verbs.SGE {
	return []verbs.SGE{{Addr: e.mr.Addr() + uint64(off), Length: uint32(n), LKey: e.mr.LKey()}}
}

func (e *end) va(off int) uint64 { return e.mr.Addr() + uint64(off) }

// locked runs f under the device's engine lock, which the transport holds
// while it touches registered memory: reading a buffer there orders the
// read after every access the transport made (for the race detector too).
func (e *end) locked(f func()) {
	devsync.Run(e.dev, f)
}

func connect(a, b *end, mtu int, timeout uint8, psnA, psnB uint32) error {
	ga, _ := a.dev.QueryGID(0)
	gb, _ := b.dev.QueryGID(0)
	if err := a.qp.Connect(verbs.RemoteInfo{QPN: b.qp.Num(), PSN: psnB, GID: gb},
		&verbs.ConnectOptions{PathMTU: mtu, SQPSN: psnA, Timeout: timeout}); err != nil {
		return err
	}
	return b.qp.Connect(verbs.RemoteInfo{QPN: a.qp.Num(), PSN: psnA, GID: ga},
		&verbs.ConnectOptions{PathMTU: mtu, SQPSN: psnB, Timeout: timeout})
}

// side is one device with what the injector needs to aim at it.
type side struct {
	name string
	dev  *verbs.Device
	// raw sends into this device, bypassing the impairment: the peer's
	// pipe end.
	raw nic.RawSender

	mu    sync.Mutex
	live  []uint32    // long-lived QPNs on this device
	mrs   [][2]uint64 // long-lived MRs on this device: va, rkey
	dead  []uint32    // recently destroyed QPNs (ring)
	deadN int
	// churned QPNs alive now: a new QP may get a number still in dead, and
	// garbage must not hit a QP the test expects to work.
	churned map[uint32]bool
}

func (s *side) addChurned(qpn uint32) {
	s.mu.Lock()
	s.churned[qpn] = true
	s.mu.Unlock()
}

func (s *side) addDead(qpn uint32) {
	s.mu.Lock()
	delete(s.churned, qpn)
	if len(s.dead) < 256 {
		s.dead = append(s.dead, qpn)
	} else {
		s.dead[s.deadN%len(s.dead)] = qpn
	}
	s.deadN++
	s.mu.Unlock()
}

type soak struct {
	t     *testing.T
	seed  uint64
	sides [2]*side
	imp   [2]*impair.Link
	pipes [2]nic.Link

	// gate pauses the workload: workers hold it shared for one iteration,
	// a measurement holds it exclusively.
	gate  sync.RWMutex
	done  chan struct{} // closed: start no new iteration
	abort context.Context
	stop  context.CancelFunc
	nerrs atomic.Int32

	longQPN map[uint32]string // long-lived QPNs, both devices

	graveMu sync.Mutex
	grave   []grave

	alloc0 uint64 // MemStats.TotalAlloc at the start

	c struct {
		qpsCreated, qpsDestroyed           atomic.Int64
		pairs                              [nChurnKinds]atomic.Int64
		longIters, longMsgs, churnMsgs     atomic.Int64
		flushed, afterDestroy, otherEvents atomic.Int64
		injected                           [nInject]atomic.Int64
	}
}

func (s *soak) fail(format string, args ...any) {
	if s.nerrs.Add(1) <= 20 {
		s.t.Errorf(format, args...)
	}
	s.stop()
}

// stopping reports whether the run is over (normally or not).
func (s *soak) stopping() bool {
	select {
	case <-s.done:
		return true
	case <-s.abort.Done():
		return true
	default:
		return false
	}
}

// collect waits until want completions arrived on c (more are an error) or
// limit passed.
func (s *soak) collect(c *verbs.CQ, want int, limit time.Duration, what string) ([]verbs.WC, bool) {
	ctx, cancel := context.WithTimeout(s.abort, limit)
	defer cancel()
	wcs := make([]verbs.WC, want+4)
	got := 0
	for got < want {
		n, err := c.Wait(ctx, wcs[got:])
		got += n
		if err != nil {
			if s.abort.Err() == nil {
				s.fail("%s: %d of %d completions after %v: %v (%v)", what, got, want, limit, err, wcs[:got])
			}
			return nil, false
		}
	}
	if got > want {
		s.fail("%s: %d completions, want %d: %v", what, got, want, wcs[:got])
		return nil, false
	}
	return wcs[:got], true
}

// sizeOf draws a message size in [lo, max], favouring small ones.
func sizeOf(r *rand.Rand, lo, max int) int {
	switch r.IntN(4) {
	case 0:
		return lo + r.IntN(min(64, max-lo)+1)
	case 1:
		return lo + r.IntN(min(4096, max-lo)+1)
	}
	return lo + r.IntN(max-lo+1)
}

// firstDiff describes where a and b first differ.
func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && a[i] == b[i] {
		i++
	}
	j := i
	for j < len(a) && a[j] != b[j] {
		j++
	}
	return fmt.Sprintf("first difference at byte %d, %d bytes differ there (got % x, want % x)",
		i, j-i, a[i:min(j, i+8)], b[i:min(j, i+8)])
}

// TestSoak: see the package comment and README.md.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test: skipped with -short")
	}
	dur := soakDuration(t)
	// The reference point: after the first minute, or a quarter of a
	// shorter run (15 s of the default 1-minute run).
	warm := min(time.Minute, dur/4)
	if dl, ok := t.Deadline(); ok && time.Until(dl) < dur+time.Minute {
		t.Fatalf("soak duration %v does not fit the test timeout (%v left): pass -timeout %v", dur, time.Until(dl).Round(time.Second), (dur + 5*time.Minute).Round(time.Minute))
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("soak: %v, reference point at %v, seed %d (-soak.seed to repeat the decisions; timing still varies)", dur, warm, seed)
	if *flagHeapProfile != "" {
		runtime.MemProfileRate = 16 << 10
	}
	g0 := runtime.NumGoroutine()

	s := &soak{t: t, seed: seed, done: make(chan struct{}), longQPN: map[uint32]string{}}
	s.abort, s.stop = context.WithCancel(context.Background())
	defer s.stop()

	// Two devices on an impaired pipe. The pipe drops packets whose ICRC is
	// wrong, as a real link does; impairment corrupts after the ICRC is
	// computed, so corrupted packets die there too.
	la, lb := pipe.New(pipe.Config{Depth: 1024})
	s.pipes = [2]nic.Link{la, lb}
	ic := func(seed uint64) impair.Config {
		return impair.Config{Loss: 0.01, Dup: 0.01, Reorder: 0.02, Corrupt: 0.002, Seed: seed}
	}
	s.imp[0], s.imp[1] = impair.Wrap(la, ic(seed)), impair.Wrap(lb, ic(seed+1))
	var devs [2]*verbs.Device
	for i, name := range []string{"A", "B"} {
		d, err := verbs.Open(s.imp[i], &verbs.Options{Name: "soak" + name})
		if err != nil {
			t.Fatal(err)
		}
		devs[i] = d
		// Garbage for device i comes from the other end of the pipe.
		s.sides[i] = &side{name: name, dev: d, raw: s.pipes[1-i].(nic.RawSender), churned: map[uint32]bool{}}
	}
	closed := false
	closeDevs := func() {
		if !closed {
			closed = true
			devs[0].Close()
			devs[1].Close()
		}
	}
	defer closeDevs()

	rng := rand.New(rand.NewPCG(seed, 1))
	var longs []*longPair
	for i := range longPairs {
		lp, err := s.newLongPair(i, devs[i%2], devs[1-i%2], []int{1024, 4096, 256, 1024}[i], rng)
		if err != nil {
			t.Fatal(err)
		}
		longs = append(longs, lp)
	}

	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	for _, d := range s.sides {
		run(func() { s.events(d) })
	}
	for _, lp := range longs {
		run(func() { s.longLoop(lp) })
	}
	tokens := time.NewTicker(time.Second / churnRate)
	defer tokens.Stop()
	for w := range churnWorkers {
		run(func() { s.churnLoop(w, tokens.C) })
	}
	for i := range s.sides {
		run(func() { s.injectLoop(i) })
	}
	run(func() {
		t := time.NewTicker(graveAge)
		defer t.Stop()
		for !s.stopping() {
			<-t.C
			s.checkGrave(false)
		}
	})

	start := time.Now()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	s.alloc0 = ms0.TotalAlloc
	var ref, fin *measurement
	warmT, endT := time.NewTimer(warm), time.NewTimer(dur)
	tick := time.NewTicker(logEvery)
	defer tick.Stop()
loop:
	for {
		select {
		case <-tick.C:
			s.progress(start)
		case <-warmT.C:
			ref = s.measure("reference", start)
		case <-endT.C:
			fin = s.measure("end", start)
			break loop
		case <-s.abort.Done():
			break loop
		}
	}
	close(s.done)
	wg.Wait()
	s.checkGrave(true)
	s.progress(start)
	s.summary(start, longs)
	if s.abort.Err() != nil || ref == nil || fin == nil {
		return
	}

	t.Logf("reference (%v): heap after GC %d bytes (%d objects), %d goroutines", ref.at.Round(time.Second), ref.heap, ref.objects, ref.goroutines)
	t.Logf("end       (%v): heap after GC %d bytes (%d objects), %d goroutines", fin.at.Round(time.Second), fin.heap, fin.objects, fin.goroutines)
	dh := float64(fin.heap)/float64(ref.heap) - 1
	dg := float64(fin.goroutines)/float64(ref.goroutines) - 1
	t.Logf("growth: heap %+.1f%%, goroutines %+.1f%% (bound +%.0f%%)", 100*dh, 100*dg, 100*growth)
	if *flagHeapProfile != "" {
		writeProfile(t, *flagHeapProfile+".ref", ref.profile)
		writeProfile(t, *flagHeapProfile+".end", fin.profile)
	}
	if dh > growth || dg > growth {
		dir := os.TempDir()
		r, e := filepath.Join(dir, fmt.Sprintf("soak-%d.heap.ref", seed)), filepath.Join(dir, fmt.Sprintf("soak-%d.heap.end", seed))
		writeProfile(t, r, ref.profile)
		writeProfile(t, e, fin.profile)
		t.Errorf("heap or goroutines grew beyond %.0f%% between %v and %v: heap %d -> %d bytes, goroutines %d -> %d; compare the heap profiles with: go tool pprof -sample_index=inuse_space -base %s %s",
			100*growth, ref.at.Round(time.Second), fin.at.Round(time.Second), ref.heap, fin.heap, ref.goroutines, fin.goroutines, r, e)
		if dg > growth {
			t.Logf("goroutines at the end:\n%s", fin.stacks)
		}
	}
	if dh < -growth {
		// Shrinking is not a leak; it says the reference point still held
		// start-up garbage. Reported, not failed.
		t.Logf("note: the heap shrank by %.1f%% after the reference point", -100*dh)
	}

	// Every injected class must have reached its drop counter: otherwise
	// the injector did not test what it claims to.
	s.checkDrops()

	// Closing the devices must stop every goroutine they started.
	closeDevs()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > g0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > g0 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after closing the devices, %d before opening them:\n%s", g, g0, buf[:runtime.Stack(buf, true)])
	}
}

func writeProfile(t *testing.T, path string, p []byte) {
	if err := os.WriteFile(path, p, 0o644); err != nil {
		t.Errorf("heap profile: %v", err)
		return
	}
	t.Logf("heap profile written to %s", path)
}

type measurement struct {
	at            time.Duration
	heap, objects uint64
	goroutines    int
	profile       []byte
	stacks        string
}

// measure pauses the workload, lets the network drain, and records the
// heap after GC and the goroutine count. At that point no churned QP
// exists and the long-lived QPs are idle, so two measurements compare the
// same state.
func (s *soak) measure(what string, start time.Time) *measurement {
	s.gate.Lock()
	defer s.gate.Unlock()
	time.Sleep(settle)
	s.checkGrave(true)
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := &measurement{at: time.Since(start), heap: ms.HeapAlloc, objects: ms.HeapObjects, goroutines: runtime.NumGoroutine()}
	var hp, gp bytes.Buffer
	pprof.Lookup("heap").WriteTo(&hp, 0)
	pprof.Lookup("goroutine").WriteTo(&gp, 1)
	m.profile, m.stacks = hp.Bytes(), gp.String()
	s.t.Logf("%6.1fs %s measurement: heap after GC %d bytes, %d objects, %d goroutines",
		m.at.Seconds(), what, m.heap, m.objects, m.goroutines)
	return m
}

func (s *soak) progress(start time.Time) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	c := &s.c
	var inj int64
	for i := range c.injected {
		inj += c.injected[i].Load()
	}
	el := time.Since(start).Seconds()
	s.t.Logf("%6.1fs QPs created %d destroyed %d, long-lived messages %d, churn messages %d, flushed %d, injected %d, heap %d bytes (live at last GC %d, %.0f MB allocated a second), goroutines %d",
		el, c.qpsCreated.Load(), c.qpsDestroyed.Load(), c.longMsgs.Load(), c.churnMsgs.Load(),
		c.flushed.Load(), inj, ms.HeapAlloc, live[0].Value.Uint64(), float64(ms.TotalAlloc-s.alloc0)/el/1e6, runtime.NumGoroutine())
}

func (s *soak) summary(start time.Time, longs []*longPair) {
	c := &s.c
	el := time.Since(start).Seconds()
	s.t.Logf("totals over %.0fs: %d QPs created (%.0f/s), %d destroyed; pairs complete %d, destroyed mid-transfer %d, moved to ERR first %d; %d long-lived iterations, %d long-lived messages, %d churn messages, %d flush completions",
		el, c.qpsCreated.Load(), float64(c.qpsCreated.Load())/el, c.qpsDestroyed.Load(), c.pairs[churnComplete].Load(),
		c.pairs[churnDestroyMid].Load(), c.pairs[churnErrFirst].Load(), c.longIters.Load(), c.longMsgs.Load(), c.churnMsgs.Load(), c.flushed.Load())
	var inj []string
	for k := range nInject {
		inj = append(inj, fmt.Sprintf("%s %d", injectNames[k], c.injected[k].Load()))
	}
	s.t.Logf("injected: %s", strings.Join(inj, ", "))
	for i, sd := range s.sides {
		st := sd.dev.Stats()
		s.t.Logf("device %s: engine %+v; link %+v; impairment %+v", sd.name, st, s.pipes[i].Stats(), s.imp[i].Counters())
	}
	for _, lp := range longs {
		qs := lp.req.qp.Stats()
		s.t.Logf("long-lived pair %d (MTU %d): %d iterations; requester QP %#x %+v", lp.id, lp.mtu, lp.iters, lp.req.qp.Num(), qs)
	}
}

// checkDrops asserts that the garbage reached the receive path and was
// dropped where it should be.
func (s *soak) checkDrops() {
	for i, sd := range s.sides {
		st := sd.dev.Stats()
		// Packets for device i enter through pipe end 1-i.
		ls := s.pipes[i].Stats()
		if st.RxMalformed == 0 || st.RxUnknownQP == 0 || st.RxBadHeader == 0 || ls.RxICRCBad == 0 {
			s.t.Errorf("device %s: garbage not seen where expected: engine %+v, link %+v", sd.name, st, ls)
		}
	}
}

// events watches a device's asynchronous events: none may name a
// long-lived QP.
func (s *soak) events(d *side) {
	for {
		select {
		case ev := <-d.dev.AsyncEvents():
			if name, ok := s.longQPN[ev.QPNum]; ok {
				s.fail("device %s: async event %v on long-lived QP %#x (%s): %s", d.name, ev.Type, ev.QPNum, name, ev.Reason)
				continue
			}
			if s.c.otherEvents.Add(1) <= 5 {
				s.t.Logf("device %s: async event %v on churned QP %#x: %s", d.name, ev.Type, ev.QPNum, ev.Reason)
			}
		case <-s.done:
			return
		case <-s.abort.Done():
			return
		}
	}
}

// ---- long-lived pairs ----

// Layout of a long-lived pair's buffers, in units of longMax (M):
//
//	requester: [0,M) WRITE source, [M,2M) SEND source, [2M,3M) WRITE-with-imm
//	           source, [3M,4M) READ destination, [4M,4M+16) atomic results
//	responder: [0,4M) WRITE target, [4M,5M) receive buffer, [5M,6M)
//	           WRITE-with-imm target, [6M,6M+8) the atomic counter
//
// Each side has a shadow: what its buffer must hold. The whole buffer is
// compared after every iteration, so a byte written anywhere it should
// not be (a ghost READ response, a replayed WRITE) is caught.
const (
	M         = longMax
	rWSrc     = 0
	rSSrc     = M
	rISrc     = 2 * M
	rRDst     = 3 * M
	rAtom     = 4 * M
	rSize     = 4*M + 16
	pWDst     = 0
	pRecv     = 4 * M
	pIDst     = 5 * M
	pCounter  = 6 * M
	pSize     = 6*M + 8
	pWDstSize = 4 * M
)

type longPair struct {
	id            int
	mtu           int
	req, resp     *end
	shReq, shResp []byte
	counter       uint64
	rng           *rand.Rand
	data          *rand.ChaCha8
	iters         uint64
}

func (s *soak) newLongPair(id int, da, db *verbs.Device, mtu int, rng *rand.Rand) (*longPair, error) {
	lp := &longPair{id: id, mtu: mtu, rng: rand.New(rand.NewPCG(s.seed, uint64(100+id)))}
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], s.seed)
	seed[8] = byte(id)
	lp.data = rand.NewChaCha8(seed)
	var err error
	if lp.req, err = newEnd(da, rSize, 64, 256); err != nil {
		return nil, err
	}
	if lp.resp, err = newEnd(db, pSize, 64, 256); err != nil {
		return nil, err
	}
	// Start PSNs anywhere, some just below the 2^24 wrap.
	psn := func() uint32 {
		if rng.IntN(2) == 0 {
			return bth.PSNMask - uint32(rng.IntN(2000))
		}
		return rng.Uint32() & bth.PSNMask
	}
	// Local ACK timeout 2^17 * 4.096 us (537 ms), 7 retries: exhausting
	// them takes over 4 s without any progress, which 1% loss does not
	// produce. 134 ms (a second of retries) was seen to fail on a 2-core
	// machine under -race with other test packages running, when the
	// pipe's queue overflowed during scheduling stalls: a stall, not a
	// defect.
	if err := connect(lp.req, lp.resp, mtu, 17, psn(), psn()); err != nil {
		return nil, err
	}
	// Non-zero, non-periodic initial contents, mirrored in the shadows.
	lp.data.Read(lp.req.buf)
	lp.data.Read(lp.resp.buf)
	lp.counter = binary.NativeEndian.Uint64(lp.resp.buf[pCounter:])
	lp.shReq, lp.shResp = slices.Clone(lp.req.buf), slices.Clone(lp.resp.buf)
	name := fmt.Sprintf("long-lived pair %d", id)
	s.longQPN[lp.req.qp.Num()] = name + " requester"
	s.longQPN[lp.resp.qp.Num()] = name + " responder"
	for i, d := range []*verbs.Device{da, db} {
		for _, sd := range s.sides {
			if sd.dev == d {
				e := []*end{lp.req, lp.resp}[i]
				sd.live = append(sd.live, e.qp.Num())
				sd.mrs = append(sd.mrs, [2]uint64{e.mr.Addr(), uint64(e.mr.RKey())})
			}
		}
	}
	return lp, nil
}

func (s *soak) longLoop(lp *longPair) {
	for !s.stopping() {
		s.gate.RLock()
		ok := s.longIter(lp)
		s.gate.RUnlock()
		if !ok {
			return
		}
	}
}

// longIter posts one round of every operation on a long-lived pair, waits
// for it and checks every completion and every byte of both buffers.
func (s *soak) longIter(lp *longPair) bool {
	r, p, rng := lp.req, lp.resp, lp.rng
	it := lp.iters
	lp.iters++
	what := fmt.Sprintf("long-lived pair %d iteration %d", lp.id, it)

	n := sizeOf(rng, 1, M)
	off := rng.IntN(pWDstSize - n + 1)
	m := sizeOf(rng, 0, M)
	k := sizeOf(rng, 0, M)
	ioff := rng.IntN(M - k + 1)
	lp.data.Read(r.buf[rWSrc : rWSrc+n])
	lp.data.Read(r.buf[rSSrc : rSSrc+m])
	lp.data.Read(r.buf[rISrc : rISrc+k])
	copy(lp.shReq[rWSrc:], r.buf[rWSrc:rWSrc+n])
	copy(lp.shReq[rSSrc:], r.buf[rSSrc:rSSrc+m])
	copy(lp.shReq[rISrc:], r.buf[rISrc:rISrc+k])
	imm1, imm2, add, swap := rng.Uint32(), rng.Uint32(), rng.Uint64(), rng.Uint64()
	compare := lp.counter + add
	if rng.IntN(4) == 0 {
		compare ^= 1 << rng.IntN(64) // a CAS that must fail
	}
	withImm := it%2 == 1

	id := it << 8
	for i, wr := range []verbs.RecvWR{
		{ID: id | 1, SGL: p.sge(pRecv, M)},
		{ID: id | 2, SGL: p.sge(pRecv, M)}, // consumed by the WRITE with immediate
	} {
		if err := p.qp.PostRecv(&wr); err != nil {
			s.fail("%s: post recv %d: %v", what, i, err)
			return false
		}
	}
	send := verbs.SendWR{ID: id | 0x13, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: r.sge(rSSrc, m)}
	if withImm {
		send.Opcode, send.Imm = verbs.WRSendWithImm, imm1
	}
	if m <= verbs.MaxInline && it%3 == 0 {
		send.Flags |= verbs.SendInline
	}
	wrs := []verbs.SendWR{
		{ID: id | 0x11, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: r.sge(rWSrc, n), RemoteAddr: p.va(pWDst + off), RKey: p.mr.RKey()},
		{ID: id | 0x12, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: r.sge(rRDst, n), RemoteAddr: p.va(pWDst + off), RKey: p.mr.RKey()},
		send,
		{ID: id | 0x14, Opcode: verbs.WRRDMAWriteWithImm, Flags: verbs.SendSignaled, SGL: r.sge(rISrc, k), RemoteAddr: p.va(pIDst + ioff), RKey: p.mr.RKey(), Imm: imm2},
		{ID: id | 0x15, Opcode: verbs.WRAtomicFetchAndAdd, Flags: verbs.SendSignaled, SGL: r.sge(rAtom, 8), RemoteAddr: p.va(pCounter), RKey: p.mr.RKey(), CompareAdd: add},
		{ID: id | 0x16, Opcode: verbs.WRAtomicCmpAndSwp, Flags: verbs.SendSignaled, SGL: r.sge(rAtom+8, 8), RemoteAddr: p.va(pCounter), RKey: p.mr.RKey(), CompareAdd: compare, Swap: swap},
	}
	wantOp := []cq.Opcode{cq.OpRDMAWrite, cq.OpRDMARead, cq.OpSend, cq.OpRDMAWrite, cq.OpFetchAdd, cq.OpCompSwap}
	for i := range wrs {
		if err := r.qp.PostSend(&wrs[i]); err != nil {
			s.fail("%s: post %v: %v", what, wrs[i].Opcode, err)
			return false
		}
	}

	swcs, ok := s.collect(r.cq, len(wrs), waitLimit, what+" (requester)")
	if !ok {
		return false
	}
	rwcs, ok := s.collect(p.cq, 2, waitLimit, what+" (responder)")
	if !ok {
		return false
	}
	// An RC QP completes its send WRs in the order posted, and its
	// receives too (IBTA §10.8).
	for i, wc := range swcs {
		if wc.Status != cq.Success || wc.WRID != wrs[i].ID || wc.Opcode != wantOp[i] || wc.QPNum != r.qp.Num() {
			s.fail("%s: completion %d is %+v (status %v), want a successful %v for wr_id %#x", what, i, wc, wc.Status, wantOp[i], wrs[i].ID)
			return false
		}
	}
	if swcs[1].ByteLen != uint32(n) {
		s.fail("%s: READ byte_len %d, want %d", what, swcs[1].ByteLen, n)
	}
	w0, w1 := rwcs[0], rwcs[1]
	switch {
	case w0.Status != cq.Success || w0.WRID != id|1 || w0.Opcode != cq.OpRecv || w0.ByteLen != uint32(m) || w0.QPNum != p.qp.Num() ||
		(w0.Flags&cq.FlagWithImm != 0) != withImm || (withImm && w0.ImmData != imm1):
		s.fail("%s: receive completion %+v (status %v), want a %d-byte RECV of wr_id %#x, with imm %v (%#x)", what, w0, w0.Status, m, id|1, withImm, imm1)
		return false
	case w1.Status != cq.Success || w1.WRID != id|2 || w1.Opcode != cq.OpRecvRDMAWithImm || w1.Flags&cq.FlagWithImm == 0 || w1.ImmData != imm2:
		s.fail("%s: receive completion %+v (status %v), want RECV_RDMA_WITH_IMM of wr_id %#x, imm %#x", what, w1, w1.Status, id|2, imm2)
		return false
	}

	// What both buffers must hold now.
	copy(lp.shResp[pWDst+off:], r.buf[rWSrc:rWSrc+n])
	copy(lp.shResp[pRecv:], r.buf[rSSrc:rSSrc+m])
	copy(lp.shResp[pIDst+ioff:], r.buf[rISrc:rISrc+k])
	copy(lp.shReq[rRDst:], r.buf[rWSrc:rWSrc+n])
	old1 := lp.counter
	lp.counter += add
	old2 := lp.counter
	if compare == lp.counter {
		lp.counter = swap
	}
	binary.NativeEndian.PutUint64(lp.shReq[rAtom:], old1)
	binary.NativeEndian.PutUint64(lp.shReq[rAtom+8:], old2)
	binary.NativeEndian.PutUint64(lp.shResp[pCounter:], lp.counter)

	ok = true
	r.locked(func() {
		if !bytes.Equal(r.buf, lp.shReq) {
			s.fail("%s: requester buffer corrupted (READ %d bytes from offset %d, atomics at %d): %s", what, n, off, rAtom, firstDiff(r.buf, lp.shReq))
			ok = false
		}
	})
	p.locked(func() {
		if !bytes.Equal(p.buf, lp.shResp) {
			s.fail("%s: responder buffer corrupted (WRITE %d bytes at %d, SEND %d bytes at %d, WRITE-imm %d bytes at %d, counter at %d): %s",
				what, n, pWDst+off, m, pRecv, k, pIDst+ioff, pCounter, firstDiff(p.buf, lp.shResp))
			ok = false
		}
	})
	if !ok {
		// Resynchronise so a single corruption is reported once.
		r.locked(func() { copy(lp.shReq, r.buf) })
		p.locked(func() { copy(lp.shResp, p.buf) })
		return false
	}
	s.c.longIters.Add(1)
	s.c.longMsgs.Add(int64(len(wrs)))
	return true
}

// ---- churn ----

const (
	churnComplete   = iota // used to completion, then destroyed
	churnDestroyMid        // destroyed with transfers in flight
	churnErrFirst          // moved to ERR with transfers in flight, flushed, destroyed
	nChurnKinds
)

// grave is a destroyed pair, kept a while to check that nothing happens
// on it any more.
type grave struct {
	at   time.Time
	what string
	ends [2]*end
	// tx is each QP's packet count when it was moved to ERR or destroyed,
	// whichever came first: a QP in ERR neither sends nor accepts packets
	// (IBTA §10.3), a destroyed one neither.
	tx   [2]uint64
	when [2]string
}

func txPackets(e *end) uint64 {
	return e.qp.Stats().TxPackets
}

func (s *soak) churnLoop(w int, tokens <-chan time.Time) {
	rng := rand.New(rand.NewPCG(s.seed, uint64(200+w)))
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], s.seed)
	seed[8], seed[9] = 0xc, byte(w)
	data := rand.NewChaCha8(seed)
	for i := 0; ; i++ {
		select {
		case <-tokens:
		case <-s.done:
			return
		case <-s.abort.Done():
			return
		}
		s.gate.RLock()
		ok := s.churnIter(w, i, rng, data)
		s.gate.RUnlock()
		if !ok {
			return
		}
	}
}

// Churned buffers: [0,64K) WRITE source/target, [64K,80K) SEND, [80K,112K)
// READ destination, [112K,112K+8) atomic word.
const (
	cWrite = 0
	cSend  = 64 << 10
	cRead  = 80 << 10
	cAtom  = 112 << 10
)

func (s *soak) churnIter(w, i int, rng *rand.Rand, data *rand.ChaCha8) bool {
	da, db := s.sides[0], s.sides[1]
	if rng.IntN(2) == 0 {
		da, db = db, da
	}
	kind := []int{churnComplete, churnComplete, churnDestroyMid, churnErrFirst}[rng.IntN(4)]
	what := fmt.Sprintf("churn worker %d pair %d (%s -> %s, kind %d)", w, i, da.name, db.name, kind)
	a, err := newEnd(da.dev, churnBuf, 16, 64)
	if err != nil {
		s.fail("%s: create: %v", what, err)
		return false
	}
	b, err := newEnd(db.dev, churnBuf, 16, 64)
	if err != nil {
		s.fail("%s: create: %v", what, err)
		return false
	}
	s.c.qpsCreated.Add(2)
	da.addChurned(a.qp.Num())
	db.addChurned(b.qp.Num())
	what = fmt.Sprintf("%s QPs %#x -> %#x", what, a.qp.Num(), b.qp.Num())
	mtu := []int{256, 1024, 4096}[rng.IntN(3)]
	// The long-lived pairs' timeout: a churned pair that exhausts its
	// retries fails the test just the same.
	if err := connect(a, b, mtu, 15, rng.Uint32()&bth.PSNMask, rng.Uint32()&bth.PSNMask); err != nil {
		s.fail("%s: connect: %v", what, err)
		return false
	}

	g := grave{what: what, ends: [2]*end{a, b}}
	ok := true
	switch kind {
	case churnComplete:
		ok = s.churnComplete(what, a, b, rng, data)
	case churnDestroyMid:
		s.churnPost(what, a, b, rng, data)
		if d := rng.IntN(4); d > 0 {
			time.Sleep(time.Duration(d) * 500 * time.Microsecond)
		}
	case churnErrFirst:
		ok = s.churnErr(what, a, b, rng, data, &g)
	}
	if !ok {
		return false
	}

	first, second := a, b
	if rng.IntN(2) == 0 {
		first, second = b, a
	}
	for _, e := range []*end{first, second} {
		if err := e.qp.Destroy(); err != nil {
			s.fail("%s: destroy QP %#x: %v", what, e.qp.Num(), err)
			return false
		}
		s.c.qpsDestroyed.Add(1)
		if i := slices.Index(g.ends[:], e); g.when[i] == "" {
			g.tx[i], g.when[i] = txPackets(e), "destroyed"
		}
	}
	for _, e := range []*end{a, b} {
		if err := e.dev.DeregMR(e.mr); err != nil {
			s.fail("%s: dereg MR: %v", what, err)
			return false
		}
		if err := e.pd.Dealloc(); err != nil {
			s.fail("%s: dealloc PD after destroying its QP and MR: %v", what, err)
			return false
		}
	}
	// Completions already queued when the QPs were destroyed may only be
	// successes or flushes (a pair destroyed mid-transfer).
	for _, e := range []*end{a, b} {
		wcs := make([]verbs.WC, 64)
		n := e.cq.Poll(wcs)
		for _, wc := range wcs[:n] {
			switch {
			case wc.Status == cq.WRFlushErr:
				s.c.flushed.Add(1)
			case wc.Status == cq.Success && kind == churnDestroyMid:
				s.c.churnMsgs.Add(1)
			default:
				s.fail("%s: completion %+v (status %v) left on QP %#x's CQ at destroy", what, wc, wc.Status, e.qp.Num())
				return false
			}
		}
	}
	da.addDead(a.qp.Num())
	db.addDead(b.qp.Num())
	g.at = time.Now()
	s.graveMu.Lock()
	s.grave = append(s.grave, g)
	s.graveMu.Unlock()
	s.c.pairs[kind].Add(1)
	return true
}

// churnComplete: WRITE, SEND and READ back, all waited for and checked.
func (s *soak) churnComplete(what string, a, b *end, rng *rand.Rand, data *rand.ChaCha8) bool {
	n, m := sizeOf(rng, 1, 8<<10), sizeOf(rng, 0, 4<<10)
	data.Read(a.buf[cWrite : cWrite+n])
	data.Read(a.buf[cSend : cSend+m])
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 1, SGL: b.sge(cSend, 16<<10)}); err != nil {
		s.fail("%s: post recv: %v", what, err)
		return false
	}
	wrs := []verbs.SendWR{
		{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: a.sge(cWrite, n), RemoteAddr: b.va(cWrite), RKey: b.mr.RKey()},
		{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: a.sge(cSend, m)},
		{ID: 3, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: a.sge(cRead, n), RemoteAddr: b.va(cWrite), RKey: b.mr.RKey()},
	}
	for i := range wrs {
		if err := a.qp.PostSend(&wrs[i]); err != nil {
			s.fail("%s: post %v: %v", what, wrs[i].Opcode, err)
			return false
		}
	}
	swcs, ok := s.collect(a.cq, 3, waitLimit, what)
	if !ok {
		return false
	}
	rwcs, ok := s.collect(b.cq, 1, waitLimit, what)
	if !ok {
		return false
	}
	for i, wc := range swcs {
		if wc.Status != cq.Success || wc.WRID != wrs[i].ID {
			s.fail("%s: completion %d is %+v (status %v), want success of wr_id %d", what, i, wc, wc.Status, wrs[i].ID)
			return false
		}
	}
	if wc := rwcs[0]; wc.Status != cq.Success || wc.ByteLen != uint32(m) {
		s.fail("%s: receive completion %+v (status %v), want %d bytes", what, wc, wc.Status, m)
		return false
	}
	ok = true
	b.locked(func() {
		if !bytes.Equal(b.buf[cWrite:cWrite+n], a.buf[cWrite:cWrite+n]) {
			s.fail("%s: WRITE of %d bytes: %s", what, n, firstDiff(b.buf[cWrite:cWrite+n], a.buf[cWrite:cWrite+n]))
			ok = false
		} else if !bytes.Equal(b.buf[cSend:cSend+m], a.buf[cSend:cSend+m]) {
			s.fail("%s: SEND of %d bytes: %s", what, m, firstDiff(b.buf[cSend:cSend+m], a.buf[cSend:cSend+m]))
			ok = false
		}
	})
	a.locked(func() {
		if ok && !bytes.Equal(a.buf[cRead:cRead+n], a.buf[cWrite:cWrite+n]) {
			s.fail("%s: READ of %d bytes: %s", what, n, firstDiff(a.buf[cRead:cRead+n], a.buf[cWrite:cWrite+n]))
			ok = false
		}
	})
	s.c.churnMsgs.Add(4)
	return ok
}

// churnPost starts large transfers on a churned pair without waiting: two
// receives on b; WRITE, SEND, READ and FETCH_AND_ADD on a. It returns the
// number of send WRs posted.
func (s *soak) churnPost(what string, a, b *end, rng *rand.Rand, data *rand.ChaCha8) int {
	data.Read(a.buf[cWrite:cAtom])
	for id := uint64(1); id <= 2; id++ {
		if err := b.qp.PostRecv(&verbs.RecvWR{ID: id, SGL: b.sge(cSend, 16<<10)}); err != nil {
			s.fail("%s: post recv: %v", what, err)
		}
	}
	wrs := []verbs.SendWR{
		{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: a.sge(cWrite, 64<<10), RemoteAddr: b.va(cWrite), RKey: b.mr.RKey()},
		{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: a.sge(cSend, 16<<10)},
		{ID: 3, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: a.sge(cRead, 32<<10), RemoteAddr: b.va(cWrite), RKey: b.mr.RKey()},
		{ID: 4, Opcode: verbs.WRAtomicFetchAndAdd, Flags: verbs.SendSignaled, SGL: a.sge(cAtom, 8), RemoteAddr: b.va(cAtom), RKey: b.mr.RKey(), CompareAdd: 1},
	}
	for i := range wrs {
		if err := a.qp.PostSend(&wrs[i]); err != nil {
			s.fail("%s: post %v: %v", what, wrs[i].Opcode, err)
		}
	}
	return len(wrs)
}

// churnErr: transfers in flight, then both QPs moved to ERR (IBTA §10.3:
// outstanding WRs complete, with WR_FLUSH_ERR unless already done). Every
// WR must complete exactly once, as a success or a flush; a WR posted in
// ERR completes with a flush at once.
func (s *soak) churnErr(what string, a, b *end, rng *rand.Rand, data *rand.ChaCha8, g *grave) bool {
	nsend := s.churnPost(what, a, b, rng, data)
	if d := rng.IntN(4); d > 0 {
		time.Sleep(time.Duration(d) * 500 * time.Microsecond)
	}
	first, second := a, b
	if rng.IntN(2) == 0 {
		first, second = b, a
	}
	for _, e := range []*end{first, second} {
		if err := e.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, qpstate.AttrState); err != nil {
			s.fail("%s: modify QP %#x to ERR: %v", what, e.qp.Num(), err)
			return false
		}
		i := slices.Index(g.ends[:], e)
		g.tx[i], g.when[i] = txPackets(e), "moved to ERR"
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 5, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: a.sge(cSend, 100)}); err != nil {
		s.fail("%s: post send in ERR: %v", what, err)
		return false
	}
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 3, SGL: b.sge(cSend, 100)}); err != nil {
		s.fail("%s: post recv in ERR: %v", what, err)
		return false
	}
	for _, x := range []struct {
		e    *end
		want int
	}{{a, nsend + 1}, {b, 3}} {
		wcs, ok := s.collect(x.e.cq, x.want, flushLimit, what+" after ERR")
		if !ok {
			return false
		}
		seen := map[uint64]bool{}
		for _, wc := range wcs {
			switch {
			case seen[wc.WRID]:
				s.fail("%s: wr_id %d completed twice on QP %#x: %v", what, wc.WRID, x.e.qp.Num(), wcs)
				return false
			case wc.Status == cq.WRFlushErr:
				s.c.flushed.Add(1)
			case wc.Status == cq.Success && wc.WRID <= 4:
				s.c.churnMsgs.Add(1)
			default:
				s.fail("%s: completion %+v (status %v) on QP %#x moved to ERR, want success or flush", what, wc, wc.Status, x.e.qp.Num())
				return false
			}
			seen[wc.WRID] = true
		}
		if st := x.e.qp.State(); st != verbs.StateErr {
			s.fail("%s: QP %#x in state %v after Modify to ERR", what, x.e.qp.Num(), st)
			return false
		}
	}
	return true
}

// checkGrave polls the CQs of destroyed pairs old enough (or all, with
// all): nothing may have completed after the destroy.
func (s *soak) checkGrave(all bool) {
	s.graveMu.Lock()
	var due []grave
	keep := s.grave[:0]
	for _, g := range s.grave {
		if all || time.Since(g.at) >= graveAge {
			due = append(due, g)
		} else {
			keep = append(keep, g)
		}
	}
	clear(s.grave[len(keep):])
	s.grave = keep
	s.graveMu.Unlock()
	wcs := make([]verbs.WC, 8)
	for _, g := range due {
		for i, e := range g.ends {
			if n := e.cq.Poll(wcs); n > 0 {
				s.c.afterDestroy.Add(int64(n))
				s.fail("%s: %d completions on QP %#x's CQ after both QPs were destroyed: %+v", g.what, n, e.qp.Num(), wcs[:n])
			}
			if tx := txPackets(e); tx != g.tx[i] {
				s.c.afterDestroy.Add(1)
				s.fail("%s: QP %#x sent %d packets after it was %s", g.what, e.qp.Num(), tx-g.tx[i], g.when[i])
			}
			// The CQ outlived its QP for this check; now it goes too.
			if err := e.dev.DestroyCQ(e.cq); err != nil {
				s.fail("%s: destroy the CQ of destroyed QP %#x: %v", g.what, e.qp.Num(), err)
			}
		}
	}
}

// ---- garbage ----

const (
	injRandom     = iota // random bytes with a valid ICRC
	injRandomICRC        // random bytes, random ICRC
	injTruncated         // a BTH to a live QP, its extended headers cut short
	injUnknownQP         // a well-formed packet to a QPN nobody has
	injDeadQP            // a well-formed packet to a QPN destroyed moments ago
	injWrongPKey         // a WRITE into live memory of a live QP, P_Key not the default partition
	injBadICRC           // a WRITE into live memory of a live QP, ICRC wrong
	injBadTVer           // a WRITE into live memory of a live QP, TVer 1
	injNotRC             // a UD SEND to a live RC QP
	nInject
)

var injectNames = [nInject]string{"random", "random-icrc", "truncated", "unknown-qp", "dead-qp", "wrong-pkey", "bad-icrc", "bad-tver", "not-rc"}

// Opcodes of well-formed garbage: requests and responses with every kind
// of extended header.
var garbageOps = []bth.Opcode{bth.RCSendFirst, bth.RCSendMiddle, bth.RCSendLast, bth.RCSendOnly, bth.RCSendOnlyImm,
	bth.RCSendOnlyInv, bth.RCWriteFirst, bth.RCWriteOnly, bth.RCWriteOnlyImm, bth.RCWriteLast, bth.RCReadRequest,
	bth.RCReadResponseFirst, bth.RCReadResponseOnly, bth.RCReadResponseLast, bth.RCAck, bth.RCAtomicAck,
	bth.RCCompareSwap, bth.RCFetchAdd}

func (s *soak) injectLoop(i int) {
	sd := s.sides[i]
	rng := rand.New(rand.NewPCG(s.seed, uint64(300+i)))
	pkts := make([]nic.Packet, injectBatch)
	for j := range pkts {
		pkts[j].Buf = make([]byte, 600)
	}
	payload := make([]byte, 512)
	t := time.NewTicker(injectEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.done:
			return
		case <-s.abort.Done():
			return
		}
		s.gate.RLock()
		sd.mu.Lock()
		for j := range pkts {
			p := &pkts[j]
			p.Remote, p.Local, p.SrcPort = netip.AddrPort{}, netip.Addr{}, 0
			k := rng.IntN(nInject)
			s.garbage(rng, sd, k, p, payload)
			s.c.injected[k].Add(1)
		}
		sd.mu.Unlock()
		if _, err := sd.raw.SendRaw(pkts); err != nil {
			s.gate.RUnlock()
			s.fail("inject into device %s: %v", sd.name, err)
			return
		}
		s.gate.RUnlock()
	}
}

// garbage builds one packet of class k for device sd into p (sd.mu held).
func (s *soak) garbage(rng *rand.Rand, sd *side, k int, p *nic.Packet, payload []byte) {
	live := sd.live[rng.IntN(len(sd.live))]
	mr := sd.mrs[rng.IntN(len(sd.mrs))]
	defaultPKey := []uint16{0xffff, 0x7fff}[rng.IntN(2)]
	wellFormed := func(qpn uint32, pkey uint16, tver uint8, op bth.Opcode) {
		info := op.Info()
		n := 0
		switch info.Payload {
		case bth.PayloadPMTU:
			n = 256
		case bth.PayloadUpTo:
			n = rng.IntN(257)
		}
		for i := range payload[:n] {
			payload[i] = byte(rng.Uint32())
		}
		f := bth.Fields{BTH: bth.BTHFields{Opcode: op, PKey: pkey, TVer: tver, DestQP: qpn, PSN: rng.Uint32() & bth.PSNMask, AckReq: rng.IntN(2) == 0},
			VA: mr[0] + uint64(rng.IntN(1024))&^7, RKey: uint32(mr[1]), DMALen: uint32(n + rng.IntN(2)*rng.IntN(1<<16)),
			Syndrome: bth.Syndrome(rng.Uint32()), MSN: rng.Uint32() & bth.PSNMask, SwapAdd: rng.Uint64(), Compare: rng.Uint64(),
			Orig: rng.Uint64(), Imm: rng.Uint32(), InvRKey: uint32(mr[1])}
		var err error
		if p.N, err = bth.Build(p.Buf, &f, payload[:n]); err != nil {
			panic(err)
		}
	}
	icrc := true
	switch k {
	case injRandom, injRandomICRC:
		p.N = 16 + rng.IntN(300)
		for i := range p.Buf[:p.N] {
			p.Buf[i] = byte(rng.Uint32())
		}
		icrc = k == injRandom
	case injTruncated:
		for {
			op := garbageOps[rng.IntN(len(garbageOps))]
			if hl := op.Info().HdrLen; hl > bth.BTHLen {
				wellFormed(live, defaultPKey, 0, op)
				p.N = bth.BTHLen + rng.IntN(hl-bth.BTHLen) + bth.ICRCLen
				break
			}
		}
	case injUnknownQP, injDeadQP:
		qpn := rng.Uint32() & bth.PSNMask
		if k == injDeadQP && len(sd.dead) > 0 {
			qpn = sd.dead[rng.IntN(len(sd.dead))]
		}
		for _, live := s.longQPN[qpn]; live || sd.churned[qpn] || qpn < 2; _, live = s.longQPN[qpn] {
			qpn = rng.Uint32() & bth.PSNMask
		}
		wellFormed(qpn, defaultPKey, 0, garbageOps[rng.IntN(len(garbageOps))])
	case injWrongPKey:
		pk := uint16(rng.Uint32())
		if pk&0x7fff == 0x7fff {
			pk ^= 1
		}
		wellFormed(live, pk, 0, bth.RCWriteOnly)
	case injBadICRC:
		wellFormed(live, defaultPKey, 0, bth.RCWriteOnly)
	case injBadTVer:
		wellFormed(live, defaultPKey, 1+uint8(rng.IntN(15)), bth.RCWriteOnly)
	case injNotRC:
		wellFormed(live, defaultPKey, 0, bth.UDSendOnly)
	}
	if icrc {
		if err := sd.raw.PutICRC(p); err != nil {
			panic(err)
		}
	}
	if k == injBadICRC {
		p.Buf[p.N-1-rng.IntN(4)] ^= byte(1 + rng.IntN(255))
	}
}

// sendFirstOnly passes every packet but the MIDDLE and LAST packets of a
// multi-packet SEND: the peer sees a SEND begin and never end.
type sendFirstOnly struct {
	nic.Link
	out []nic.Packet
	idx []int // index in the caller's batch of each packet in out
}

func (l *sendFirstOnly) Send(pkts []nic.Packet) (int, error) {
	l.out, l.idx = l.out[:0], l.idx[:0]
	for i, p := range pkts {
		if op := bth.BTH(p.Bytes()).Opcode(); op != bth.RCSendMiddle && op != bth.RCSendLast {
			l.out, l.idx = append(l.out, p), append(l.idx, i)
		}
	}
	if n, err := l.Link.Send(l.out); err != nil {
		return l.idx[n], err // nic.Link: the index of the packet that failed
	}
	return len(pkts), nil
}

// TestERRFlushesReceiveInProgress is the deterministic form of a loss the
// soak test finds: a receive WQE that a multi-packet SEND has started to
// fill is still outstanding, so moving the QP to ERR must complete it with
// WR_FLUSH_ERR like every other outstanding WR (IBTA §10.3).
func TestERRFlushesReceiveInProgress(t *testing.T) {
	la, lb := pipe.New(pipe.Config{})
	da, err := verbs.Open(&sendFirstOnly{Link: la}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := verbs.Open(lb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, err := newEnd(da, 8192, 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newEnd(db, 8192, 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := connect(a, b, 1024, 14, 0x100, 0x200); err != nil {
		t.Fatal(err)
	}
	for id := uint64(7); id <= 8; id++ {
		if err := b.qp.PostRecv(&verbs.RecvWR{ID: id, SGL: b.sge(0, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: a.sge(0, 4096)}); err != nil {
		t.Fatal(err)
	}
	// Wait until B has taken receive 7 for the SEND: its SEND_FIRST arrived.
	for {
		if b.qp.Stats().RxPackets > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, qpstate.AttrState); err != nil {
		t.Fatal(err)
	}
	// The flush happens in the transition: no packet or timer is needed.
	wcs := make([]verbs.WC, 4)
	n := b.cq.Poll(wcs)
	var got []string
	for _, wc := range wcs[:n] {
		got = append(got, fmt.Sprintf("wr_id %d %v", wc.WRID, wc.Status))
	}
	if n != 2 || wcs[0].WRID != 7 || wcs[1].WRID != 8 || wcs[0].Status != cq.WRFlushErr || wcs[1].Status != cq.WRFlushErr {
		t.Fatalf("after ERR the receive CQ holds [%s], want wr_id 7 and 8 flushed, in order", strings.Join(got, ", "))
	}
}
