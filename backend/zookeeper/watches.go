package zookeeper

import (
	"errors"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Watches hands the watch events of one ZooKeeper connection to the
// Backend that uses it, so that the Backend follows every lease it holds
// from the client's own event delivery, with no goroutine per held lease.
// Make one per connection with NewWatches, pass its Callback to zk.Connect
// (zk.WithEventCallback(w.Callback)), and give it to New in
// Options.Watches; Dial does all of that itself. A Watches serves one
// Backend. Safe for concurrent use.
type Watches struct {
	mu sync.Mutex
	// seen says Callback was called: the connection delivers to it.
	seen bool
	// to is the Backend's, from New until Close; nil otherwise.
	to *heldWatch
}

// NewWatches returns a Watches that no connection delivers to yet.
func NewWatches() *Watches { return &Watches{} }

// Callback takes one event of the connection: go-zookeeper calls the
// connection's event callback for every change of the session's state and
// for every watch that fires (with the node's path), including the
// EventNotWatching of each watch the client drops when the server expired
// the session. It never blocks, and sends no request, as go-zookeeper
// calls it from its receiving goroutine. A program with an event callback
// of its own calls Callback from it.
func (w *Watches) Callback(ev zk.Event) {
	w.mu.Lock()
	w.seen = true
	to := w.to
	w.mu.Unlock()
	if to != nil && ev.Type != zk.EventSession {
		to.event(ev)
	}
}

// attach makes w deliver to to; false if it delivers to another Backend.
func (w *Watches) attach(to *heldWatch) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.to != nil {
		return false
	}
	w.to = to
	return true
}

// detach stops w delivering to to.
func (w *Watches) detach(to *heldWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.to == to {
		w.to = nil
	}
}

// delivered reports whether the connection has called Callback.
func (w *Watches) delivered() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// heldWatch ends the term of a held lease when its latch node is deleted
// (by an operator, or by ZooKeeper expiring the session), replaced by a
// node of another czxid, or dropped with the expired session. Each held
// node has a data watch (getData), which ZooKeeper fires once, on the
// node's deletion or a change of its data; go-zookeeper sets the watches
// again on every reconnection to the same session (SetWatches, from the
// last zxid it saw, so what changed while it was cut off fires at once),
// and drops them all with an EventNotWatching that carries
// zk.ErrSessionExpired once the server says the session expired.
//
// With Options.Watches, the connection's event callback hands every event
// to heldWatch, which finds the held lease by the event's path: one
// goroutine (run) handles the events of every held lease, and a goroutine
// runs only while a watch is being set. Without it, a goroutine per held
// lease waits on its watch's channel. Safe for concurrent use.
type heldWatch struct {
	b *Backend
	// routed says the events come through Options.Watches.
	routed bool

	mu      sync.Mutex
	held    map[string]*held // by node path
	pending []zk.Event       // for run to handle, in order
	wake    chan struct{}    // has a value once pending is not empty
}

func newHeldWatch(b *Backend, routed bool) *heldWatch {
	return &heldWatch{b: b, routed: routed, held: map[string]*held{}, wake: make(chan struct{}, 1)}
}

// event queues ev, if it is about a held node, for run.
func (w *heldWatch) event(ev zk.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held[ev.Path] == nil {
		return // a waiting campaign's watch, or a lease no longer held
	}
	w.pending = append(w.pending, ev)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run handles the queued events until the Backend closes.
func (w *heldWatch) run() {
	for {
		select {
		case <-w.b.ctx.Done():
			return
		case <-w.wake:
		}
		w.mu.Lock()
		evs := w.pending
		w.pending = nil
		w.mu.Unlock()
		for _, ev := range evs {
			w.mu.Lock()
			h := w.held[ev.Path]
			w.mu.Unlock()
			if h != nil {
				w.handle(h, ev)
			}
		}
	}
}

// handle acts on ev, an event of h's node: the term is lost, or the watch
// fired on a change of the node's data and is set again (which also
// checks the node). The EventNotWatching of a closed client asks for
// nothing: no watch can be set any more, and the terms end at their
// safe-until for want of renewals.
func (w *heldWatch) handle(h *held, ev zk.Event) {
	if h.ctx.Err() != nil || h.term.Err() != nil {
		return
	}
	switch why := lostBy(ev); {
	case why != "":
		w.b.lose(h, why)
	case ev.Type == zk.EventNotWatching:
	default:
		w.check(h)
	}
}

// lostBy returns why ev, an event of a held node's watch, means the term
// is lost, or "".
func lostBy(ev zk.Event) string {
	switch {
	case ev.Type == zk.EventNodeDeleted:
		return deleted
	case ev.Type == zk.EventNotWatching && errors.Is(ev.Err, zk.ErrSessionExpired):
		return expiredWith
	}
	return ""
}

const (
	deleted     = "was deleted (by an operator, or by ZooKeeper expiring the session)"
	expiredWith = "went with its expired session"
)

// add watches h's node.
func (w *heldWatch) add(h *held) {
	w.mu.Lock()
	w.held[h.path] = h
	w.mu.Unlock()
	w.check(h)
}

// remove stops watching h's node.
func (w *heldWatch) remove(h *held) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held[h.path] == h {
		delete(w.held, h.path)
	}
}

// check sets h's watch in a goroutine of its own, which ends once the
// watch is set (routed) or once the term ends (not routed). One runs per
// held lease at a time: an event meanwhile makes it set the watch again.
func (w *heldWatch) check(h *held) {
	w.mu.Lock()
	if w.held[h.path] != h {
		w.mu.Unlock()
		return
	}
	if h.checking {
		h.again = true
		w.mu.Unlock()
		return
	}
	h.checking = true
	w.mu.Unlock()
	if !w.b.sessions.Go(func() { w.watch(h) }) {
		// Closed: Close ends the term.
		w.mu.Lock()
		h.checking = false
		w.mu.Unlock()
	}
}

// watch sets h's watch, checking the node, until it is set and (not
// routed) fires, or h's term is lost or ended.
func (w *heldWatch) watch(h *held) {
	for {
		why, ch := w.b.setWatch(h)
		if why != "" {
			w.b.lose(h, why)
		}
		if ch == nil {
			break // lost, or ended
		}
		if !w.routed {
			select {
			case ev := <-ch:
				if why := lostBy(ev); why != "" {
					w.b.lose(h, why)
					return
				}
				// Its data changed, or the client closed: look again.
				continue
			case <-h.ctx.Done():
				return
			}
		}
		w.mu.Lock()
		if !h.again {
			h.checking = false
			w.mu.Unlock()
			return
		}
		h.again = false
		w.mu.Unlock()
	}
	w.mu.Lock()
	h.checking = false
	w.mu.Unlock()
}
