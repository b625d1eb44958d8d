package dcqcn

import "time"

// NP is the notification point's state for one QP: when it last asked for
// a CNP. It is a small value the caller embeds in its per-QP state; the
// zero value is ready. Keeping it with the QP costs no lookup and no
// memory beyond the QP's own, and dies with the QP.
type NP struct {
	last time.Time
	sent bool
}

// OnMarked handles a CE-marked packet received for this QP at now and
// reports whether to send a CNP: at most one per interval
// (Params.CNPInterval, np_min_time_between_cnps). c, if not nil, counts
// the marked packet and the CNP decided on.
func (n *NP) OnMarked(now time.Time, interval time.Duration, c *Counters) bool {
	if c != nil {
		c.NPECNMarkedRoCEPackets++
	}
	if n.sent && now.Sub(n.last) < interval {
		return false
	}
	n.last, n.sent = now, true
	if c != nil {
		c.NPCNPSent++
	}
	return true
}

// NPTable is the notification point for callers without per-QP state to
// embed an NP in (a UD responder answering many senders, say): NP state
// by key, pruned as it ages. An entry older than the interval decides
// nothing, so the table holds at most the keys marked within one interval
// (each sweep runs once per interval and costs one pass over the map), and
// never more than Max keys: a packet for a new key when the table is full
// gets its CNP without being recorded, since a spare CNP only slows a
// sender while a missing one lets congestion grow.
type NPTable[K comparable] struct {
	Interval time.Duration
	Max      int // 0: no bound
	m        map[K]time.Time
	swept    time.Time
}

// OnMarked is NP.OnMarked for key k.
func (t *NPTable[K]) OnMarked(now time.Time, k K, c *Counters) bool {
	if c != nil {
		c.NPECNMarkedRoCEPackets++
	}
	if t.m == nil {
		t.m = make(map[K]time.Time)
		t.swept = now
	}
	if now.Sub(t.swept) >= t.Interval {
		t.sweep(now)
	}
	last, ok := t.m[k]
	if ok && now.Sub(last) < t.Interval {
		return false
	}
	if ok || t.Max <= 0 || len(t.m) < t.Max {
		t.m[k] = now
	}
	if c != nil {
		c.NPCNPSent++
	}
	return true
}

// Len is the number of keys held.
func (t *NPTable[K]) Len() int { return len(t.m) }

func (t *NPTable[K]) sweep(now time.Time) {
	for k, last := range t.m {
		if now.Sub(last) >= t.Interval {
			delete(t.m, k)
		}
	}
	t.swept = now
}
