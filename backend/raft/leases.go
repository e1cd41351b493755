package raft

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/batonhq/baton"
	hraft "github.com/hashicorp/raft"
)

// The lease API of a member: what `baton agent` serves to operators. It
// reads the group's table through the raft leader, follows the log's lease
// events as this member applies them, and asks holders to resign.

// LeaseInfo is one lease of the group's table.
type LeaseInfo struct {
	Name      string    // lease name
	Holder    string    // candidate ID of the holder; "" when free
	Token     uint64    // the holder's fencing token (the latest token when free)
	Since     time.Time // wall-clock start of the term (informational)
	SafeUntil time.Time // wall clock: until when the group will not give the lease to another candidate (the holder session's expiry as the raft leader sees it); zero when free or unknown
	Member    string    // node ID of the member through which the holder's session was made ("" when free)
	Waiters   int       // candidates queued
	// ResignRequested reports that a resign was requested (RequestResign)
	// and the holder has not yet released.
	ResignRequested bool
}

// LeaseEvent is one change to a lease, in log order, as this member applied it.
type LeaseEvent struct {
	Lease   string
	Kind    EventKind // EventQueued, EventDequeued, EventElected, EventReleased, EventLost
	Holder  string    // the candidate concerned
	Session string    // its session
	Member  string    // node ID of the member the session belongs to
	Token   uint64    // the term's token (Elected/Released/Lost)
	At      time.Time // the proposer's wall clock in the command (informational)
	// Reason says, for Released and Lost, why the term ended: "resigned"
	// (Resign), "resign-requested" (a release after RequestResign),
	// "session-expired" (the raft leader expired the session, or its
	// Backend gave it up past its safe-until) or "session-closed" (the
	// Backend closed). A Dequeued event has "session-expired" or
	// "session-closed" when the waiter's session went, "" when the
	// candidate gave up.
	Reason string
}

// EventKind says what a LeaseEvent is.
type EventKind string

// The kinds of LeaseEvent.
const (
	EventQueued   EventKind = "queued"   // a candidate started waiting
	EventDequeued EventKind = "dequeued" // a waiting candidate gave up
	EventElected  EventKind = "elected"  // a candidate got the lease
	EventReleased EventKind = "released" // the holder gave it up (Resign, Close, or a requested resign)
	EventLost     EventKind = "lost"     // the holder's session expired (or was destroyed) while holding
)

// resignOrder is a lease a session holds whose resign was requested; the
// raft leader hands it out with each renewal of the session.
type resignOrder struct {
	Lease string `json:"lease"`
	Token uint64 `json:"token"`
}

// Leases returns the group's lease table, sorted by name: every lease that
// someone holds or waits for (the group forgets a lease nobody holds or
// waits for; its state, see baton.StateTerm, is kept). It reads through the
// raft leader (linearizable) so that SafeUntil is known; ctx bounds it,
// including the wait for a raft leader. Errors wrap
// baton.ErrBackendUnavailable.
func (n *Node) Leases(ctx context.Context) ([]LeaseInfo, error) {
	return n.leaseTable(ctx, "")
}

// Lease returns one lease, read as Leases reads; an error wrapping
// baton.ErrNoLeader when the group has no record of name (nobody holds or
// waits for it).
func (n *Node) Lease(ctx context.Context, name string) (LeaseInfo, error) {
	if name == "" {
		return LeaseInfo{}, errors.New("raft: lease name must not be empty")
	}
	infos, err := n.leaseTable(ctx, name)
	if err != nil {
		return LeaseInfo{}, err
	}
	if len(infos) == 0 {
		return LeaseInfo{}, fmt.Errorf("%w: lease %q: nobody holds or waits for it", baton.ErrNoLeader, name)
	}
	return infos[0], nil
}

func (n *Node) leaseTable(ctx context.Context, name string) ([]LeaseInfo, error) {
	infos, err := retryNotLeader(ctx, func(ctx context.Context) ([]LeaseInfo, error) {
		if n.ctx.Err() != nil {
			return nil, errNodeClosed
		}
		if n.isReady() {
			return n.leasesLocal(name)
		}
		var out []LeaseInfo
		err := n.forwardJSON(ctx, "/v1/raft/leases?"+url.Values{"name": {name}}.Encode(), nil, &out)
		return out, err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: read the lease table: %w", baton.ErrBackendUnavailable, err)
	}
	if infos == nil {
		infos = []LeaseInfo{}
	}
	return infos, nil
}

// leasesLocal reads the table on the raft leader, after confirming with a
// quorum that it still leads, and adds each holder's session expiry.
func (n *Node) leasesLocal(name string) ([]LeaseInfo, error) {
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	rows := n.fsm.table(name)
	sessions := make([]string, 0, len(rows))
	for _, r := range rows {
		if r.session != "" {
			sessions = append(sessions, r.session)
		}
	}
	exp := n.timers.expiries(sessions)
	out := make([]LeaseInfo, len(rows))
	for i, r := range rows {
		out[i] = r.LeaseInfo
		if d, ok := exp[r.session]; ok {
			out[i].SafeUntil = d.Round(0) // wall clock only: it leaves this process
		}
	}
	return out, nil
}

func (n *Node) serveLeases(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	n.leaderOnly(w, r, nil, func() (any, error) { return n.leasesLocal(name) })
}

// WatchLeases calls fn for every lease event this member applies from now on, in log order,
// on one goroutine of its own (fn must not block for long); stop unsubscribes and waits for fn to return.
//
// Events queue up for fn without bound while it is busy, so that none is
// lost. They describe the log as this member applies it: a member that
// catches up from a snapshot (after a long absence) reports no events for
// the entries the snapshot covers. stop must not be called from fn; it may
// be called after the Node is closed, and more than once.
func (n *Node) WatchLeases(fn func(LeaseEvent)) (stop func()) {
	w := n.fsm.subscribe(fn, false)
	quit := make(chan struct{})
	go w.run(quit)
	var once sync.Once
	return func() {
		once.Do(func() {
			n.fsm.unsubscribe(w)
			close(quit)
		})
		<-w.done
	}
}

// leaseWatcher is one subscription to the FSM's lease events (WatchLeases,
// heldWatch): the FSM appends events to its queue (never blocking the
// apply), and its goroutine (run) hands them to fn.
type leaseWatcher struct {
	fn func(LeaseEvent)
	// restores asks for an eventRestored when the FSM restores a
	// snapshot, whose entries give no events.
	restores bool
	wake     chan struct{} // one pending signal
	done     chan struct{} // closed when run returns

	mu    sync.Mutex
	queue []LeaseEvent
}

// eventRestored is the event a leaseWatcher with restores gets when the
// FSM restored a snapshot: any lease may have changed, unreported. Only
// this package's watchers get it, never WatchLeases.
const eventRestored EventKind = "restored"

// subscribe adds a watcher calling fn; its events reach fn once run runs.
func (f *fsm) subscribe(fn func(LeaseEvent), restores bool) *leaseWatcher {
	w := &leaseWatcher{fn: fn, restores: restores, wake: make(chan struct{}, 1), done: make(chan struct{})}
	f.mu.Lock()
	f.watchers[w] = struct{}{}
	f.mu.Unlock()
	return w
}

// unsubscribe stops giving events to w.
func (f *fsm) unsubscribe(w *leaseWatcher) {
	f.mu.Lock()
	delete(f.watchers, w)
	f.mu.Unlock()
}

func (w *leaseWatcher) push(evs []LeaseEvent) {
	w.mu.Lock()
	w.queue = append(w.queue, evs...)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run hands w's events to its fn until quit is closed.
func (w *leaseWatcher) run(quit <-chan struct{}) {
	defer close(w.done)
	for {
		select {
		case <-quit:
			return
		case <-w.wake:
		}
		w.mu.Lock()
		evs := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, ev := range evs {
			select {
			case <-quit:
				return
			default:
			}
			w.fn(ev)
		}
	}
}

// RequestResign asks the holder of name to resign: the request is committed
// to the log, and the holder's backend learns of it at its next renewal (at
// most one renew interval later). It only asks: the holder's term goes on
// while the holder stops its work (an Elector cancels its callback and waits
// for it; `baton run` stops its command), and then the holder resigns, which
// releases the lease to the first waiter without waiting for a TTL (see
// baton.ResignRequestTerm). So nobody else gets the lease before the
// holder's work has stopped and it released, or its session expired. It
// returns once the request is committed (not when the holder has
// released); an error wrapping baton.ErrNoLeader when nobody holds name.
//
// ctx bounds the wait for a raft leader too; other failures wrap
// baton.ErrBackendUnavailable. A holder that does not act on the request (a
// program holding Terms without an Elector that ignores ResignRequested, or
// a Backend that never renews again) keeps the lease until it resigns or
// its session expires.
func (n *Node) RequestResign(ctx context.Context, name string) error {
	if name == "" {
		return errors.New("raft: lease name must not be empty")
	}
	res, err := n.apply(ctx, command{Op: opRequestResign, Lease: name, Time: time.Now()})
	if err != nil {
		return fmt.Errorf("%w: request resign of lease %q: %w", baton.ErrBackendUnavailable, name, err)
	}
	switch {
	case res.Err == errNoHolder:
		return fmt.Errorf("%w: lease %q: nobody holds it, so nobody can resign it", baton.ErrNoLeader, name)
	case res.Err != "":
		return fmt.Errorf("%w: request resign of lease %q refused: %s", baton.ErrBackendUnavailable, name, res.Err)
	}
	n.log.Info("resign requested", "lease", name, "token", res.Token)
	return nil
}

// Determined returns nil when this member can answer who holds what (it knows a raft leader and
// the group has a quorum), or an error saying why not.
//
// It asks no one: a raft leader holds a quorum's recent acknowledgement
// (hashicorp/raft steps down within half a heartbeat timeout without one),
// and a follower has heard from that leader within a heartbeat timeout.
func (n *Node) Determined() error {
	if n.ctx.Err() != nil {
		return errNodeClosed
	}
	switch st := n.raft.State(); st {
	case hraft.Leader:
		if !n.isReady() {
			return errors.New("raft: this member was just elected raft leader and is still applying the log")
		}
		return nil
	case hraft.Follower:
		addr, id := n.raft.LeaderWithID()
		if addr == "" {
			return errors.New("raft: no raft leader known: an election is under way, or too few voters are reachable for a quorum")
		}
		if last := time.Since(n.raft.LastContact()); last > n.opts.HeartbeatTimeout {
			return fmt.Errorf("raft: last heard from the raft leader %s %s ago (heartbeat timeout %s): it may have lost its quorum",
				id, last.Round(time.Millisecond), n.opts.HeartbeatTimeout)
		}
		return nil
	default:
		return fmt.Errorf("raft: this member is a %s: no raft leader known, too few voters are reachable for a quorum", st)
	}
}

// expiries returns the deadlines of sessions, on the raft leader's clock; a
// session this leader has not timed yet gets its full TTL from now, as run
// would give it.
func (t *sessionTimers) expiries(sessions []string) map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]time.Time, len(sessions))
	if !t.running {
		return out
	}
	for _, id := range sessions {
		d, ok := t.deadline[id]
		if !ok {
			s, known := t.n.fsm.session(id)
			if !known {
				continue
			}
			d = time.Now().Add(s.TTL)
			t.deadline[id] = d
		}
		out[id] = d
	}
	return out
}
