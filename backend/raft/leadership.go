package raft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	hraft "github.com/hashicorp/raft"
)

// watchLeadership follows this member's raft leadership. Raft writes every
// change to NotifyCh and blocks until it is read, so none is lost.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			n.stepDown()
			return
		case leader := <-n.notify:
			if leader {
				n.stepUp()
			} else {
				n.stepDown()
			}
		}
	}
}

// stepUp starts the leader's duties once everything committed in earlier
// terms is applied here.
func (n *Node) stepUp() {
	n.stepDown()
	// The term this member was elected in: raft's current term, unless it
	// lost it already (then ctx ends at the next notification anyway).
	term := n.raft.CurrentTerm()
	n.heard.lead(term)
	ctx, cancel := context.WithCancel(n.ctx)
	n.mu.Lock()
	n.leading = cancel
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.await(n.raft.Barrier(0)); err != nil {
			n.log.Warn("raft leader could not apply the log; not serving", "err", err)
			return
		}
		// The barrier committed the earlier terms' entries; followers
		// learn so from the next AppendEntries.
		n.nudgeFollowers()
		if ctx.Err() != nil {
			return
		}
		if !n.finishRecovery(ctx) {
			return
		}
		// Every session gets its TTL from the last moment an earlier
		// leader could have confirmed a renewal (heard.go): a session
		// must never expire before its holder's safe-until.
		n.timers.start(ctx, n.sessionBase(ctx, term))
		n.mu.Lock()
		if ctx.Err() == nil {
			// Not after stepDown: it cancels ctx under this lock. A late
			// goroutine of an earlier term must not clear a newer one's
			// flag either, hence no write of false.
			n.ready = true
		}
		n.mu.Unlock()
		// An earlier term's autopilot may still be winding down (its
		// context ended, a server probe in flight): Start would take it
		// for running and start nothing for this term. The lock keeps a
		// late goroutine of an earlier term from starting in between.
		n.pilotMu.Lock()
		<-n.pilot.Stop()
		if ctx.Err() == nil {
			n.pilot.Start(ctx)
		}
		n.pilotMu.Unlock()
		if ctx.Err() != nil {
			return
		}
		n.log.Info("raft leader ready", "id", n.id, "sessions", n.timers.count())
		if n.opts.Departures != nil {
			n.wg.Add(1)
			go n.followDepartures(ctx)
		}
		if n.opts.Witness {
			n.log.Info("witness handing raft leadership on")
			if err := n.await(n.raft.LeadershipTransfer()); err != nil {
				n.log.Warn("witness could not hand raft leadership on", "err", err)
			}
		}
		<-ctx.Done()
	}()
}

func (n *Node) stepDown() {
	n.mu.Lock()
	cancel := n.leading
	if cancel != nil {
		// Under the lock, so that the term's goroutine cannot set ready
		// again after this: it sets it only while its context lives.
		cancel()
	}
	n.leading = nil
	n.ready = false
	n.mu.Unlock()
	n.heard.lead(0)
	if cancel != nil {
		n.timers.stop()
	}
}

// isReady reports whether this member is the raft leader with its log
// applied, able to serve renewals and consistent reads.
func (n *Node) isReady() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ready
}

// sessionTimers holds each session's expiry deadline on the raft leader's
// monotonic clock. They live only in the leader's memory; a new leader
// starts them afresh, at a TTL from the base sessionBase finds.
type sessionTimers struct {
	n    *Node
	wake chan struct{}

	mu       sync.Mutex
	running  bool
	deadline map[string]time.Time
	done     chan struct{}
}

func newSessionTimers(n *Node) *sessionTimers {
	return &sessionTimers{n: n, wake: make(chan struct{}, 1), deadline: map[string]time.Time{}}
}

// start times every session in the log at its TTL from base.
func (t *sessionTimers) start(ctx context.Context, base time.Time) {
	t.mu.Lock()
	if ctx.Err() != nil {
		// The term ended before its timers started (stepDown cancels
		// before it stops them): renewals must not be confirmed here.
		t.mu.Unlock()
		return
	}
	t.running = true
	t.deadline = map[string]time.Time{}
	for id, s := range t.n.fsm.sessions() {
		t.deadline[id] = base.Add(s.TTL)
	}
	t.done = make(chan struct{})
	done := t.done
	t.mu.Unlock()
	t.n.wg.Add(1)
	go func() {
		defer t.n.wg.Done()
		defer close(done)
		t.run(ctx)
	}()
}

func (t *sessionTimers) stop() {
	t.mu.Lock()
	t.running = false
	t.deadline = map[string]time.Time{}
	done := t.done
	t.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (t *sessionTimers) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.deadline)
}

// touch gives session a full TTL from now. It reports false when the log
// has no such session (it expired, or never was).
func (t *sessionTimers) touch(session string) (time.Duration, bool) {
	s, ok := t.n.fsm.session(session)
	if !ok {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running {
		return 0, false
	}
	t.deadline[session] = time.Now().Add(s.TTL)
	return s.TTL, true
}

// run expires sessions whose deadline passed, and picks up sessions created
// since (they get a full TTL from when this leader first sees them).
func (t *sessionTimers) run(ctx context.Context) {
	_, changed := t.n.fsm.applied()
	for {
		now := time.Now()
		sessions := t.n.fsm.sessions()
		var expired []string
		next := now.Add(time.Hour)
		t.mu.Lock()
		for id := range t.deadline {
			if _, ok := sessions[id]; !ok {
				delete(t.deadline, id)
			}
		}
		for id, s := range sessions {
			d, ok := t.deadline[id]
			if !ok {
				d = now.Add(s.TTL)
				t.deadline[id] = d
			}
			if !now.Before(d) {
				expired = append(expired, id)
				continue
			}
			if d.Before(next) {
				next = d
			}
		}
		t.mu.Unlock()
		for _, id := range expired {
			t.n.log.Info("session expired: its member stopped renewing", "session", id)
			if _, err := t.n.applyLocal(command{Op: opSessionExpire, Session: id, Time: time.Now()}); err != nil {
				t.n.log.Warn("could not expire session", "session", id, "err", err)
				next = now.Add(10 * time.Millisecond)
			}
		}
		_, changed = t.n.fsm.applied()
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-changed:
			timer.Stop()
		}
	}
}

var noopCommand = []byte(`{"op":"noop"}`)

// await waits for f, or until this member starts to stop. hashicorp/raft
// can leave a future unanswered when it shuts down just after committing
// the entry (hashicorp/raft#498); waiting for it then would keep Close
// from returning, since the waiter is one of the member's goroutines.
func (n *Node) await(f hraft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-n.ctx.Done():
		return hraft.ErrRaftShutdown
	}
}

// applyLocal applies c through this member's raft, which must be the
// leader.
func (n *Node) applyLocal(c command) (*result, error) {
	if c.Op == opSessionCreate && c.TTL > n.opts.MaxTTL {
		return nil, &apiError{Status: http.StatusBadRequest, Msg: fmt.Sprintf(
			"raft: session TTL %s is above the group's longest, %s: use a shorter TTL, or raise MaxTTL (--max-ttl) on every member (a recovery from a lost majority then holds grants that much longer)", c.TTL, n.opts.MaxTTL)}
	}
	b, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	f := n.raft.Apply(b, 5*time.Second)
	if err := n.await(f); err != nil {
		if errors.Is(err, hraft.ErrNotLeader) || errors.Is(err, hraft.ErrLeadershipLost) || errors.Is(err, hraft.ErrLeadershipTransferInProgress) {
			return nil, fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		return nil, err
	}
	r, ok := f.Response().(*result)
	if !ok {
		return nil, fmt.Errorf("raft: unexpected apply response %T", f.Response())
	}
	if c.Op != opNoop {
		n.nudgeFollowers()
	}
	return r, nil
}

// nudgeFollowers has the leader append a no-op entry after one that
// committed. Followers learn that an entry is committed only from the
// next AppendEntries, and the raft leader sends one unasked only every
// CommitTimeout, which is long (startRaft) so that an idle group costs
// little: without the next entry, a waiter on a follower would learn that
// it was handed a lease, and a watcher there of a change, up to two
// CommitTimeouts late. The no-op is appended after the entry committed,
// so the AppendEntries that carries it carries that commit. Requests
// coalesce: at most one no-op is in flight and one more asked for, so a
// burst of entries costs one or two no-ops, not one each.
func (n *Node) nudgeFollowers() {
	select {
	case n.nudge <- struct{}{}:
	default: // a no-op is asked for already, and will be appended after this entry committed
	}
}

// sendNudges appends the no-ops nudgeFollowers asks for, one at a time,
// until the member closes.
func (n *Node) sendNudges() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.nudge:
		}
		// Not leader (any more): the new leader's barrier and its own
		// nudges carry the commit index instead.
		_ = n.await(n.raft.Apply(noopCommand, 0))
	}
}
