package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// driver is the Backend's backend.SessionDriver. Redis has no server
// sessions: a "session" is the process's renewal loop, and a renewal is
// one script call that extends every lease key the process holds (one
// round trip, with the WAIT for replicas pipelined behind it).
type driver struct{ b *Backend }

var _ backend.SessionDriver[string] = driver{}

// Grant implements backend.SessionDriver. Nothing is written: the lease
// keys carry their own expiry.
func (d driver) Grant(ctx context.Context) (backend.SessionGrant[string], error) {
	cfg := d.b.o.cfg
	return backend.SessionGrant[string]{
		ID: randomID(), SafeUntil: cfg.SafeUntil(time.Now(), cfg.TTL), TTL: cfg.TTL,
		Span: cfg.TTL - cfg.DriftMargin,
	}, nil
}

// Renew implements backend.SessionDriver: one round trip that extends
// every held lease key still holding its term's value, whatever their
// number. The new safe-until is measured from the send time, or from the
// send time of an acquisition still in flight if that is earlier (its key
// was set then, and is not in this renewal). A key that no longer holds
// its value ends its term with baton.ErrLeaseLost. A renewal the
// replicas did not acknowledge (Options.Replicas) does not count.
func (d driver) Renew(ctx context.Context, id string) (time.Time, error) {
	b := d.b
	start := time.Now()
	b.mu.Lock()
	var terms []*term
	for name, t := range b.held {
		if t.Err() != nil {
			delete(b.held, name)
			continue
		}
		if t.session == id {
			terms = append(terms, t)
		}
	}
	for _, at := range b.inflight {
		if at.Before(start) {
			start = at
		}
	}
	b.mu.Unlock()
	if len(terms) == 0 {
		return b.o.cfg.SafeUntil(start, b.o.cfg.TTL), nil
	}
	keys := make([]string, len(terms))
	args := make([]any, 1, len(terms)+1)
	args[0] = b.ttlMS()
	for i, t := range terms {
		keys[i] = t.keys.Lease
		args = append(args, t.value)
	}
	res, acked, err := b.evalWait(ctx, renewScript, keys, args...)
	if err != nil {
		return time.Time{}, err
	}
	lost, _ := res.([]any)
	for _, x := range lost {
		i, _ := x.(int64)
		if i < 1 || int(i) > len(terms) {
			continue
		}
		t := terms[i-1]
		b.forget(t)
		if t.End(fmt.Errorf("%w: lease %q: its key %s no longer holds this term (token %d): it expired, was deleted, or Redis lost it in a restart or failover",
			baton.ErrLeaseLost, t.name, t.keys.Lease, t.Token())) {
			b.o.log.Warn("a held lease's key no longer holds this term: the term ended", "lease", t.name, "key", t.keys.Lease, "token", t.Token())
		}
	}
	if acked < b.o.Replicas {
		return time.Time{}, fmt.Errorf("redis: %d of the %d replicas (Options.Replicas) acknowledged the renewal within %s: a failover could lose it, so it does not count", acked, b.o.Replicas, b.o.wait)
	}
	until := b.o.cfg.SafeUntil(start, b.o.cfg.TTL)
	// A granted term whose key this renewal covered and kept is this
	// process's own from the renewal's send time on: its cap is lifted.
	for _, t := range terms {
		if t.Err() == nil {
			t.uncap(until)
		}
	}
	return until, nil
}

// Revoke implements backend.SessionDriver: deletes every lease key that
// session id still holds, and publishes each, in one script call. The
// keys of a later session's terms are not its: a revocation retried in
// the background while the server was unreachable may land after the
// process took leases under a new session, whose renewals go on
// extending those terms.
func (d driver) Revoke(ctx context.Context, id string, _ bool) error {
	b := d.b
	b.mu.Lock()
	var terms []*term
	for name, t := range b.held {
		if t.session == id {
			terms = append(terms, t)
			delete(b.held, name)
		}
	}
	b.mu.Unlock()
	for _, t := range terms {
		// A term is over once its session is: no renewal extends it.
		t.End(fmt.Errorf("%w: lease %q: its session was revoked", baton.ErrLeaseLost, t.name))
	}
	if len(terms) == 0 {
		return nil
	}
	keys := make([]string, 0, 6*len(terms))
	args := make([]any, 3, len(terms)+3)
	args[0], args[1], args[2] = Channel(b.o.Prefix), wakePrefix(b.o.Prefix), b.wakeGrace()
	for _, t := range terms {
		keys = append(keys, b.releaseKeys(t.keys.Lease)...)
		args = append(args, t.value)
	}
	if _, _, err := b.evalWait(ctx, releaseScript, keys, args...); err != nil {
		return fmt.Errorf("redis: delete %d lease keys (they expire a TTL after their last renewal): %w", len(terms), err)
	}
	return nil
}

// Gone implements backend.SessionDriver: there is no server session to
// lose; a lost key ends its own term.
func (driver) Gone(error) bool { return false }
