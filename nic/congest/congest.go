// Package congest is a congestion relay: a bottleneck of a configured
// rate with a queue that marks ECN-capable packets Congestion Experienced
// (RED/ECN between Kmin and Kmax, as a datacenter switch does for RoCEv2)
// and drops when full. It wraps any nic.Link in process, on injected time.
//
// Kernel veth and tap devices mark nothing and the local kernel has no
// netem (docs/platform.md, No netem), so this is how a congestion-control
// test sees CE marks: the receiver answers them with CNPs, the sender
// slows down (docs/congestion.md).
//
// Queue is the bottleneck's logic alone (no packets stored): a fluid
// queue that says, for each packet offered at a time, whether it is
// dropped, marked or passed, and when it leaves. Link puts it on the send
// side of a nic.Link, holding packets until they leave.
//
// Marking follows RED with the instantaneous queue, as DCQCN switches
// are configured: below Kmin nothing is marked, between Kmin and Kmax an
// ECN-capable packet (ECT(0) or ECT(1)) is marked CE with a probability
// rising linearly to Pmax, above Kmax every one is. A packet that is not
// ECN-capable passes below Kmax and is dropped above it, as RED would drop
// it; a packet already CE passes as it is. A packet that does not fit the
// queue is dropped (tail drop). The ECN bits are the low two bits of
// nic.Packet.TClass (IPv4 TOS, IPv6 traffic class; RFC 3168), which the
// ICRC does not cover, so marking leaves the packet valid.
//
// Decisions are drawn from a PCG generator seeded by Config.Seed: the same
// seed, arrivals and times give the same marks.
package congest

import (
	"github.com/softroce/softroce/nic/internal/spec"

	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// ECN codepoints in the low two bits of a traffic class (RFC 3168).
const (
	NotECT  = 0b00
	ECT1    = 0b01
	ECT0    = 0b10
	CE      = 0b11
	ECNMask = 0b11
)

// Config describes the bottleneck. Sizes are bytes, the rate bits per
// second.
type Config struct {
	// Rate is the bottleneck's rate in bits per second (required).
	Rate float64
	// Queue is the buffer in bytes (default DefaultQueue); a packet that
	// would overflow it is dropped.
	Queue int
	// Kmin and Kmax are the RED thresholds on the queue in bytes; Kmax 0
	// disables marking (and RED drops): a plain tail-drop queue.
	Kmin, Kmax int
	// Pmax is the marking probability at Kmax, in (0, 1] when marking.
	Pmax float64
	// Seed seeds the marking decisions; 0 picks one from the clock.
	Seed uint64
}

// DefaultQueue is the default Config.Queue: 1 MB, the order of a shallow
// datacenter switch's buffer per port.
const DefaultQueue = 1 << 20

// Validate reports inconsistent settings.
func (c *Config) Validate() error {
	var errs []error
	if !(c.Rate > 0) {
		errs = append(errs, fmt.Errorf("congest: rate %g b/s: must be positive", c.Rate))
	}
	if c.Queue < 0 {
		errs = append(errs, fmt.Errorf("congest: queue %d bytes: must not be negative", c.Queue))
	}
	if c.Kmax != 0 {
		if c.Kmin < 0 || c.Kmin >= c.Kmax {
			errs = append(errs, fmt.Errorf("congest: kmin %d, kmax %d bytes: want 0 <= kmin < kmax", c.Kmin, c.Kmax))
		}
		if !(c.Pmax > 0 && c.Pmax <= 1) {
			errs = append(errs, fmt.Errorf("congest: pmax %g: must be in (0, 1] when marking", c.Pmax))
		}
	}
	return errors.Join(errs...)
}

// Parse reads a Config from a comma-separated list such as
// "rate=10Gbit,queue=1MB,kmin=40KB,kmax=200KB,pmax=20%,seed=7". Rates
// take k, M, G suffixes with an optional "bit" (bits per second; 1000
// based); sizes take KB, MB (1000 based) or KiB, MiB; pmax is a
// percentage or a fraction. The result is validated.
func Parse(s string) (Config, error) {
	var c Config
	err := spec.Each(s, "congest", "rate, queue, kmin, kmax, pmax or seed", func(k, v string) error {
		var err error
		switch k {
		case "rate":
			c.Rate, err = parseRate(v)
		case "queue":
			c.Queue, err = parseSize(v)
		case "kmin":
			c.Kmin, err = parseSize(v)
		case "kmax":
			c.Kmax, err = parseSize(v)
		case "pmax":
			c.Pmax, err = spec.Prob(v)
		case "seed":
			c.Seed, err = strconv.ParseUint(v, 0, 64)
		default:
			return spec.ErrUnknownKey
		}
		return err
	})
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func parseRate(v string) (float64, error) {
	s := strings.TrimSuffix(strings.TrimSuffix(v, "bit"), "bps")
	mult := 1.0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult, s = 1e3, s[:n-1]
		case 'M':
			mult, s = 1e6, s[:n-1]
		case 'G':
			mult, s = 1e9, s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0) {
		return 0, errors.New("want a positive rate in bits per second such as 10G, 2.5Gbit or 100Mbit")
	}
	return f * mult, nil
}

var sizeUnits = []struct {
	suffix string
	mult   int
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"KB", 1000}, {"MB", 1000 * 1000}, {"B", 1}}

func parseSize(v string) (int, error) {
	mult := 1
	for _, u := range sizeUnits {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSuffix(v, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0, errors.New("want a size in bytes such as 65536, 40KB or 1MiB")
	}
	return n * mult, nil
}

// String formats c in the syntax Parse reads, omitting zero fields.
func (c Config) String() string {
	var parts []string
	if c.Rate != 0 {
		parts = append(parts, "rate="+strconv.FormatFloat(c.Rate, 'g', -1, 64))
	}
	for _, f := range []struct {
		k string
		v int
	}{{"queue", c.Queue}, {"kmin", c.Kmin}, {"kmax", c.Kmax}} {
		if f.v != 0 {
			parts = append(parts, f.k+"="+strconv.Itoa(f.v))
		}
	}
	if c.Pmax != 0 {
		parts = append(parts, "pmax="+strconv.FormatFloat(c.Pmax, 'g', -1, 64))
	}
	if c.Seed != 0 {
		parts = append(parts, "seed="+strconv.FormatUint(c.Seed, 10))
	}
	return strings.Join(parts, ",")
}

// Counters say what the queue did.
type Counters struct {
	Enqueued    uint64 `json:"enqueued"`     // packets accepted (marked ones included)
	Marked      uint64 `json:"marked"`       // ECN-capable packets marked CE here
	Dropped     uint64 `json:"dropped"`      // packets dropped: DroppedFull + DroppedRED
	DroppedFull uint64 `json:"dropped_full"` // did not fit the queue (tail drop)
	DroppedRED  uint64 `json:"dropped_red"`  // not ECN-capable, queue above Kmax
	MaxQueue    int    `json:"max_queue"`    // the longest queue seen, in bytes, counting the packet just accepted
}

// Verdict is what the queue did with a packet.
type Verdict uint8

// Verdicts.
const (
	Passed  Verdict = iota + 1 // accepted unchanged
	Marked                     // accepted, marked CE
	Dropped                    // not accepted
)

// Queue is the bottleneck on injected time. Its zero value is unusable:
// use NewQueue. It is not safe for concurrent use.
type Queue struct {
	cfg       Config
	rng       *rand.Rand
	busyUntil time.Time // when the last accepted packet has left
	c         Counters
}

// NewQueue returns an empty queue; cfg must be valid (Validate).
func NewQueue(cfg Config) *Queue {
	if cfg.Queue == 0 {
		cfg.Queue = DefaultQueue
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) | 1
		cfg.Seed = seed
	}
	return &Queue{cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Config returns the configuration, defaults filled in and the seed in use.
func (q *Queue) Config() Config { return q.cfg }

// Counters returns what the queue has done so far.
func (q *Queue) Counters() Counters { return q.c }

// Len is the queue in bytes at now: what has not left the bottleneck,
// counting the part of a packet not yet serialised.
func (q *Queue) Len(now time.Time) int {
	d := q.busyUntil.Sub(now)
	if d <= 0 {
		return 0
	}
	return int(d.Seconds() * q.cfg.Rate / 8)
}

// Enqueue offers a packet of size bytes with traffic class tclass at now.
// It returns the verdict, the traffic class the packet leaves with (CE
// set when marked) and, unless dropped, when its last bit leaves the
// bottleneck. Times must not go backwards.
func (q *Queue) Enqueue(now time.Time, size int, tclass uint8) (v Verdict, out uint8, departs time.Time) {
	qlen := q.Len(now)
	// Draw for every packet so one packet's kind does not shift the
	// stream for the others.
	u := q.rng.Float64()
	if qlen+size > q.cfg.Queue {
		q.c.Dropped++
		q.c.DroppedFull++
		return Dropped, tclass, time.Time{}
	}
	v, out = Passed, tclass
	if q.cfg.Kmax > 0 && qlen > q.cfg.Kmin {
		p := 1.0
		if qlen < q.cfg.Kmax {
			p = q.cfg.Pmax * float64(qlen-q.cfg.Kmin) / float64(q.cfg.Kmax-q.cfg.Kmin)
		}
		switch tclass & ECNMask {
		case ECT0, ECT1:
			if u < p {
				v, out = Marked, tclass|CE
				q.c.Marked++
			}
		case NotECT:
			if qlen >= q.cfg.Kmax {
				q.c.Dropped++
				q.c.DroppedRED++
				return Dropped, tclass, time.Time{}
			}
		}
	}
	start := q.busyUntil
	if start.Before(now) {
		start = now
	}
	q.busyUntil = start.Add(q.serialise(size))
	q.c.Enqueued++
	q.c.MaxQueue = max(q.c.MaxQueue, qlen+size)
	return v, out, q.busyUntil
}

// serialise is the time size bytes take at the bottleneck's rate.
func (q *Queue) serialise(size int) time.Duration {
	return time.Duration(math.Round(float64(size) * 8 / q.cfg.Rate * 1e9))
}
