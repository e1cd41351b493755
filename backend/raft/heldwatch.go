package raft

import (
	"context"
	"sync"
)

// heldWatch ends the terms of the leases a Backend on a member holds when
// the member's copy of the log gives a lease to another term (the raft
// leader expired the session, or a release landed that the term did not
// make). One subscription to the member's lease events serves every held
// lease, whatever their number, instead of a goroutine waiting on each:
// an event on a held lease, or a snapshot restored (whose entries give no
// events), makes it look the lease up in the member's copy of the log.
// Safe for concurrent use.
type heldWatch struct {
	b *Backend
	f *fsm

	mu   sync.Mutex
	held map[string]*held // by lease name
	// sessions are the sessions with a hook that forgets their held
	// leases when they end (their terms end with them).
	sessions map[*sess]struct{}
	// w is the subscription, made at the first hold; nil before, and
	// after the Backend closed.
	w *leaseWatcher
}

func newHeldWatch(b *Backend, f *fsm) *heldWatch {
	return &heldWatch{b: b, f: f, held: map[string]*held{}, sessions: map[*sess]struct{}{}}
}

// add watches h, whose term the entry at index h.at granted. It subscribes
// to the log before it reads it, so that any change after the read reaches
// the subscription with h known.
func (w *heldWatch) add(h *held) {
	w.mu.Lock()
	if w.w == nil {
		sub := w.f.subscribe(w.event, true)
		if !w.b.sessions.Go(func() { w.run(sub) }) {
			// Closed: Close ends the term.
			w.f.unsubscribe(sub)
			w.mu.Unlock()
			return
		}
		w.w = sub
	}
	w.held[h.name] = h
	if _, ok := w.sessions[h.s]; !ok {
		s := h.s
		w.sessions[s] = struct{}{}
		context.AfterFunc(s.Context(), func() { w.sessionEnded(s) })
	}
	w.mu.Unlock()
	w.check(h)
}

// run hands the log's events to event until the Backend closes.
func (w *heldWatch) run(sub *leaseWatcher) {
	defer w.f.unsubscribe(sub)
	sub.run(w.b.sessions.Context().Done())
}

// event looks up the held lease ev is about, or every held lease after a
// restore.
func (w *heldWatch) event(ev LeaseEvent) {
	if ev.Kind == eventRestored {
		w.mu.Lock()
		hs := make([]*held, 0, len(w.held))
		for _, h := range w.held {
			hs = append(hs, h)
		}
		w.mu.Unlock()
		for _, h := range hs {
			w.check(h)
		}
		return
	}
	w.mu.Lock()
	h := w.held[ev.Lease]
	w.mu.Unlock()
	if h != nil {
		w.check(h)
	}
}

// check ends h's term if this copy of the log, once it applied the entry
// that granted it, gives the lease to anything but h's session and token.
func (w *heldWatch) check(h *held) {
	idx, session, token := w.f.holder(h.name)
	if idx < h.at || (session == h.s.ID && token == h.token) {
		return
	}
	if !w.remove(h) {
		return
	}
	w.b.lose(h)
}

// remove stops watching h, and reports whether it was watched.
func (w *heldWatch) remove(h *held) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held[h.name] != h {
		return false
	}
	delete(w.held, h.name)
	return true
}

// sessionEnded forgets the leases held on s, whose terms ended with it.
func (w *heldWatch) sessionEnded(s *sess) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, h := range w.held {
		if h.s == s {
			delete(w.held, name)
		}
	}
	delete(w.sessions, s)
}
