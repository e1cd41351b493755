package raft

import (
	"context"
	"sync"
	"time"
)

// agentWatch ends the terms of the leases a Backend on an agent client
// holds when the agent's copy of the log gives a lease to another term, as
// heldWatch does on a member: one long-poll of the agent (POST
// /v1/raft/held) names every held lease of a session, instead of one per
// lease, each holding a goroutine and a connection. A new term restarts
// the poll with it, a moment later, so that a burst of wins restarts it
// once. An agent without the call (an earlier version) is long-polled per
// lease (Backend.watchHeld). Safe for concurrent use.
type agentWatch struct {
	b *Backend
	c *Client

	mu      sync.Mutex
	held    map[string]*held // by lease name
	running bool
	// perLease is set once the agent turned out not to serve the call:
	// each held lease then has a watchHeld goroutine, started by add.
	perLease bool
	kick     chan struct{} // a term was added: restart the poll
}

// agentWatchWait is how long one poll waits for a change; agentWatchGather
// is how long after a new term the poll is restarted, gathering the terms
// won meanwhile into one restart.
const (
	agentWatchWait   = 30 * time.Second
	agentWatchGather = 50 * time.Millisecond
)

func newAgentWatch(b *Backend, c *Client) *agentWatch {
	return &agentWatch{b: b, c: c, held: map[string]*held{}, kick: make(chan struct{}, 1)}
}

// add watches h, whose term the entry at index h.at granted.
func (w *agentWatch) add(h *held) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.perLease {
		w.watchAlone(h)
		return
	}
	w.held[h.name] = h
	if !w.running {
		// The poll's first round reads h from held.
		if w.b.sessions.Go(w.run) {
			w.running = true
		} // else closed: Close ends the term
		return
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// watchAlone starts h's own long-poll. Called with w.mu held.
func (w *agentWatch) watchAlone(h *held) {
	ctx, stop := context.WithCancel(h.s.Context())
	h.stop = stop
	w.b.sessions.Go(func() { w.b.watchHeld(ctx, h, h.at) })
}

// remove stops watching h, and reports whether it was watched here (and
// not by a long-poll of its own).
func (w *agentWatch) remove(h *held) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.stop != nil {
		h.stop()
	}
	if w.held[h.name] != h {
		return false
	}
	delete(w.held, h.name)
	return true
}

// snapshot returns the held leases of one session still alive, in chunks
// of at most heldChunkTerms leases and about heldChunkBytes of names (a
// call each), with the highest index of the entries that granted them;
// nil when none.
func (w *agentWatch) snapshot() (*sess, []map[string]*held, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var s *sess
	for name, h := range w.held {
		if h.s.Context().Err() != nil {
			delete(w.held, name) // its term ended with the session
			continue
		}
		if s == nil {
			s = h.s
		}
	}
	if s == nil {
		return nil, nil, 0
	}
	var (
		chunks []map[string]*held
		cur    map[string]*held
		size   int
		at     uint64
	)
	for name, h := range w.held {
		if h.s != s {
			continue // another session's: at the next round
		}
		if cur == nil || len(cur) >= heldChunkTerms || size+len(name) > heldChunkBytes {
			cur, size = map[string]*held{}, 0
			chunks = append(chunks, cur)
		}
		cur[name], size, at = h, size+len(name)+24, max(at, h.at)
	}
	return s, chunks, at
}

// heldChunkTerms and heldChunkBytes bound one POST /v1/raft/held: the
// member takes at most maxHeldTerms terms and a body of 1 MiB.
const (
	heldChunkTerms = maxHeldTerms / 2
	heldChunkBytes = 512 << 10
)

// pollResult is one chunk's answer.
type pollResult struct {
	chunk map[string]*held
	lost  []string
	err   error
}

// run polls the agent for the held leases until the Backend closes: a
// call per chunk of them, all at once; when one returns, the others are
// cancelled, and the next round asks again with what is held then.
func (w *agentWatch) run() {
	done := w.b.sessions.Context().Done()
	for {
		s, chunks, at := w.snapshot()
		if s == nil {
			select {
			case <-done:
				return
			case <-w.kick:
				continue
			}
		}
		ctx, cancel := context.WithCancel(s.Context())
		results := make(chan pollResult, len(chunks))
		for _, chunk := range chunks {
			terms := make(map[string]uint64, len(chunk))
			for name, h := range chunk {
				terms[name] = h.token
			}
			go func() {
				lost, err := w.c.heldLost(ctx, s.ID, terms, at, agentWatchWait)
				results <- pollResult{chunk, lost, err}
			}()
		}
		restarted := false
		var first pollResult
		select {
		case first = <-results:
		case <-w.kick:
			// Gather the terms won meanwhile into one restart.
			t := time.NewTimer(agentWatchGather)
			select {
			case <-t.C:
			case first = <-results:
				t.Stop()
			}
			restarted = true
		}
		cancel()
		rs := []pollResult{}
		if first.chunk != nil {
			rs = append(rs, first)
		}
		for len(rs) < len(chunks) {
			rs = append(rs, <-results)
		}
		for _, r := range rs {
			if r.err != nil && notServed(r.err) {
				w.fallBack(r.err)
				return
			}
			for _, name := range r.lost {
				if h := r.chunk[name]; h != nil && w.remove(h) {
					w.b.lose(h)
				}
			}
		}
		// The others' errors are the cancellation's.
		if !restarted && first.err != nil {
			// The agent restarting, say: try again shortly. The session's
			// renewals, not this poll, decide whether terms survive.
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// fallBack turns to one long-poll per held lease: the agent does not serve
// POST /v1/raft/held (an earlier version).
func (w *agentWatch) fallBack(err error) {
	w.b.log.Debug("the agent serves no POST /v1/raft/held (an earlier version): one long-poll per held lease", "err", err)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.perLease = true
	for name, h := range w.held {
		delete(w.held, name)
		w.watchAlone(h)
	}
	w.running = false
}
