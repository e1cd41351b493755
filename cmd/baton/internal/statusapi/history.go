package statusapi

import (
	"slices"
	"sync"
	"time"

	"github.com/batonhq/baton/backend/raft"
)

// term is one term of a lease as this process saw it.
type term struct {
	Holder  string
	Member  string
	Session string
	Token   uint64
	// Start is when this process applied the election, or, for a term that
	// was running when the handler started, the term's Since from the lease
	// table. StartKnown is false for a term whose end the handler saw but
	// whose start it did not (it began before the handler watched, and
	// ended before the table was read): Start is then the handler's start.
	Start      time.Time
	StartKnown bool
	End        time.Time      // zero while the term runs
	Kind       raft.EventKind // raft.EventReleased or raft.EventLost once ended
	Reason     string
}

// ongoing reports whether the term has not ended.
func (t *term) ongoing() bool { return t.End.IsZero() }

// leaseHist is the recent terms of one lease, oldest first.
type leaseHist struct {
	terms   []term
	touched time.Time // last event or seed
}

// Ended is a term that ended, as Handler.AwaitEnd reports it.
type Ended struct {
	Holder string
	Token  uint64
	Kind   raft.EventKind
	Reason string
}

// resignWait is a POST .../resign waiting for the end of the term with
// token (or a later one) of its lease.
type resignWait struct {
	token uint64
	done  chan Ended // buffered; sent to once
}

// waitKey is a candidate's place in a lease's queue.
type waitKey struct{ lease, session string }

// history remembers, per lease, the terms of the last window, from the
// lease events this member applies. It also drives the metrics that follow
// the events, under the same lock, so that both see one order. Safe for
// concurrent use.
type history struct {
	window    time.Duration
	maxTerms  int
	maxLeases int
	here      func(holder, member string) bool // whether a term is "held here"
	metrics   *Metrics
	now       func() time.Time
	started   time.Time

	mu      sync.Mutex
	leases  map[string]*leaseHist
	untrack int // leases not remembered because maxLeases were
	queued  map[waitKey]time.Time
	waiters map[string][]*resignWait
}

// maxQueued bounds the queue entries remembered for the campaign-wait
// histogram.
const maxQueued = 10000

func newHistory(here func(holder, member string) bool, window time.Duration, maxTerms, maxLeases int, m *Metrics, now func() time.Time) *history {
	return &history{
		window: window, maxTerms: maxTerms, maxLeases: maxLeases, here: here, metrics: m, now: now,
		started: now(),
		leases:  map[string]*leaseHist{}, queued: map[waitKey]time.Time{}, waiters: map[string][]*resignWait{},
	}
}

// apply records one event. The time is this process's clock when it applied
// the event, not the event's At (the proposer's clock): one clock for the
// whole timeline, and the same as the page's "now".
func (h *history) apply(ev raft.LeaseEvent) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.metrics.transition(ev)
	switch ev.Kind {
	case raft.EventQueued:
		h.queue(waitKey{ev.Lease, ev.Session}, now)
	case raft.EventDequeued:
		delete(h.queued, waitKey{ev.Lease, ev.Session})
	case raft.EventElected:
		k := waitKey{ev.Lease, ev.Session}
		if at, ok := h.queued[k]; ok {
			h.metrics.campaignWait(ev.Lease, now.Sub(at))
			delete(h.queued, k)
		}
		h.metrics.setLeader(ev.Lease, h.here(ev.Holder, ev.Member))
		l := h.lease(ev.Lease, now)
		if l == nil {
			return
		}
		if i := l.find(ev.Token); i >= 0 {
			return // seeded already
		}
		// Events come in log order, so the previous term has ended; should
		// its end have been missed, the new term ends it.
		if n := len(l.terms); n > 0 && l.terms[n-1].ongoing() {
			h.end(ev.Lease, &l.terms[n-1], now, "", "superseded")
		}
		l.add(term{Holder: ev.Holder, Member: ev.Member, Session: ev.Session, Token: ev.Token, Start: now, StartKnown: true}, h.maxTerms)
	case raft.EventReleased, raft.EventLost:
		if cur, ok := h.current(ev.Lease); !ok || cur.Token <= ev.Token {
			h.metrics.setLeader(ev.Lease, false)
		}
		l := h.lease(ev.Lease, now)
		if l == nil {
			h.notify(ev.Lease, Ended{Holder: ev.Holder, Token: ev.Token, Kind: ev.Kind, Reason: ev.Reason})
			return
		}
		i := l.find(ev.Token)
		if i < 0 {
			// It began before this process watched; its start shows once
			// the lease table is read (seed), else from the handler's start.
			l.add(term{Holder: ev.Holder, Member: ev.Member, Session: ev.Session, Token: ev.Token, Start: h.started}, h.maxTerms)
			i = l.find(ev.Token)
		}
		h.end(ev.Lease, &l.terms[i], now, ev.Kind, ev.Reason)
	}
}

// end ends t at at, observes its duration, and wakes resign waiters.
func (h *history) end(lease string, t *term, at time.Time, kind raft.EventKind, reason string) {
	if !t.ongoing() {
		return
	}
	t.End, t.Kind, t.Reason = at, kind, reason
	if t.StartKnown {
		h.metrics.termEnded(lease, max(at.Sub(t.Start), 0))
	}
	h.notify(lease, Ended{Holder: t.Holder, Token: t.Token, Kind: kind, Reason: reason})
}

func (h *history) notify(lease string, e Ended) {
	ws := h.waiters[lease]
	kept := ws[:0]
	for _, w := range ws {
		if e.Token >= w.token {
			w.done <- e
			continue
		}
		kept = append(kept, w)
	}
	if len(kept) == 0 {
		delete(h.waiters, lease)
	} else {
		h.waiters[lease] = kept
	}
}

func (h *history) queue(k waitKey, now time.Time) {
	if len(h.queued) >= maxQueued {
		for q, at := range h.queued {
			if now.Sub(at) > h.window {
				delete(h.queued, q)
			}
		}
		if len(h.queued) >= maxQueued {
			return
		}
	}
	h.queued[k] = now
}

// current returns lease's running term, if this process knows of one.
func (h *history) current(lease string) (term, bool) {
	l := h.leases[lease]
	if l == nil || len(l.terms) == 0 || !l.terms[len(l.terms)-1].ongoing() {
		return term{}, false
	}
	return l.terms[len(l.terms)-1], true
}

// lease returns name's history, creating it (nil when maxLeases are
// remembered and none can make room).
func (h *history) lease(name string, now time.Time) *leaseHist {
	if l := h.leases[name]; l != nil {
		l.touched = now
		return l
	}
	h.pruneLocked(now)
	if len(h.leases) >= h.maxLeases {
		// Make room by forgetting the lease idle longest with no running
		// term; running terms are what the page is for.
		var victim string
		var oldest time.Time
		for n, l := range h.leases {
			if len(l.terms) > 0 && l.terms[len(l.terms)-1].ongoing() {
				continue
			}
			if victim == "" || l.touched.Before(oldest) {
				victim, oldest = n, l.touched
			}
		}
		if victim == "" {
			h.untrack++
			return nil
		}
		delete(h.leases, victim)
		h.metrics.forget(victim)
	}
	l := &leaseHist{touched: now}
	h.leases[name] = l
	return l
}

// find returns the index of the term with token, or -1.
func (l *leaseHist) find(token uint64) int {
	return slices.IndexFunc(l.terms, func(t term) bool { return t.Token == token })
}

// add inserts t in token order, dropping the oldest beyond max.
func (l *leaseHist) add(t term, max int) {
	i, _ := slices.BinarySearchFunc(l.terms, t.Token, func(x term, tok uint64) int {
		switch {
		case x.Token < tok:
			return -1
		case x.Token > tok:
			return 1
		}
		return 0
	})
	l.terms = slices.Insert(l.terms, i, t)
	if over := len(l.terms) - max; over > 0 {
		l.terms = slices.Delete(l.terms, 0, over)
	}
}

// seed merges the lease table read when the handler started: running terms
// this process has no event for begin at their Since.
func (h *history) seed(infos []raft.LeaseInfo) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, in := range infos {
		if in.Holder == "" {
			continue
		}
		l := h.leases[in.Name]
		if l != nil {
			if i := l.find(in.Token); i >= 0 {
				if t := &l.terms[i]; !t.StartKnown && !in.Since.IsZero() {
					t.Start, t.StartKnown = in.Since, true
				}
				continue
			}
			if n := len(l.terms); n > 0 && l.terms[n-1].Token > in.Token {
				continue // the table is older than events already seen
			}
		}
		if l = h.lease(in.Name, now); l == nil {
			continue
		}
		start, known := in.Since, true
		if start.IsZero() {
			start, known = h.started, false
		}
		l.add(term{Holder: in.Holder, Member: in.Member, Token: in.Token, Start: start, StartKnown: known}, h.maxTerms)
		h.metrics.setLeader(in.Name, h.here(in.Holder, in.Member))
	}
}

// awaitEnd registers a wait for the end of lease's term with token, or of
// a later one. It returns at once (closed over) when that end is known
// already.
func (h *history) awaitEnd(lease string, token uint64) (<-chan Ended, func()) {
	w := &resignWait{token: token, done: make(chan Ended, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.leases[lease]; l != nil {
		for _, t := range l.terms {
			if t.Token >= token && !t.ongoing() {
				w.done <- Ended{Holder: t.Holder, Token: t.Token, Kind: t.Kind, Reason: t.Reason}
				return w.done, func() {}
			}
		}
	}
	h.waiters[lease] = append(h.waiters[lease], w)
	return w.done, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.waiters[lease] = slices.DeleteFunc(h.waiters[lease], func(x *resignWait) bool { return x == w })
		if len(h.waiters[lease]) == 0 {
			delete(h.waiters, lease)
		}
	}
}

// prune forgets what pruneLocked does.
func (h *history) prune() {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pruneLocked(now)
}

// pruneLocked forgets terms that ended before the window, and leases left
// with none, metric series included.
func (h *history) pruneLocked(now time.Time) {
	from := now.Add(-h.window)
	for name, l := range h.leases {
		l.terms = slices.DeleteFunc(l.terms, func(t term) bool { return !t.ongoing() && t.End.Before(from) })
		if len(l.terms) == 0 {
			delete(h.leases, name)
			h.metrics.forget(name)
		}
	}
}

// snapshot returns a copy of the terms of the window, per lease, and how
// many leases are not remembered.
func (h *history) snapshot() (map[string][]term, int) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pruneLocked(now)
	out := make(map[string][]term, len(h.leases))
	for name, l := range h.leases {
		out[name] = slices.Clone(l.terms)
	}
	return out, h.untrack
}
