package raft

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// sess is this Backend's session in the group and the terms riding on it.
// The raft leader expires it TTL after the last renewal it confirmed;
// safe-until is measured from when that renewal was sent.
type sess = backend.Session[string]

// driver is the Backend's backend.SessionDriver: sessions in the group's log.
type driver struct{ b *Backend }

var _ backend.SessionDriver[string] = driver{}

// newSessions returns the Manager of b's sessions.
func newSessions(b *Backend) *backend.SessionManager[string] {
	return backend.NewSessionManager(driver{b}, backend.SessionOptions[string]{
		Backend: "raft",
		Config:  b.cfg,
		// Bounded, so that a group without a leader shows up as
		// ErrBackendUnavailable (the Elector logs it and retries) rather
		// than a silent wait.
		GrantTimeout: max(b.cfg.TTL, 5*time.Second),
		// By then the raft leader has expired it anyway.
		AbandonFor: b.cfg.TTL,
		Describe:   func(id string) string { return "session " + id },
		Lost:       "expired in the group (renewals did not reach the raft leader in time)",
		Log:        b.log,
	})
}

// Grant implements backend.SessionDriver.
func (d driver) Grant(ctx context.Context) (backend.SessionGrant[string], error) {
	b := d.b
	id := randomID("s-")
	start := time.Now()
	res, err := b.g.apply(ctx, command{Op: opSessionCreate, Session: id, Node: b.g.member(), TTL: b.cfg.TTL, Time: start})
	if err != nil {
		return backend.SessionGrant[string]{}, err
	}
	if res.Err != "" {
		return backend.SessionGrant[string]{}, fmt.Errorf("%w: create session: %s", baton.ErrBackendUnavailable, res.Err)
	}
	b.log.Debug("session created", "session", id, "member", b.g.member(), "ttl", b.cfg.TTL)
	return backend.SessionGrant[string]{
		ID: id, SafeUntil: b.cfg.SafeUntil(start, b.cfg.TTL), TTL: b.cfg.TTL, Span: b.cfg.TTL - b.cfg.DriftMargin,
	}, nil
}

// Renew implements backend.SessionDriver. It passes on the resign requests the
// group holds for our terms.
func (d driver) Renew(ctx context.Context, id string) (time.Time, error) {
	start := time.Now()
	r, err := d.b.g.renew(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	if len(r.Resign) > 0 {
		d.b.resignRequested(id, r.Resign)
	}
	return d.b.cfg.SafeUntil(start, r.TTL), nil
}

// Revoke implements backend.SessionDriver: it destroys the session, which
// releases its leases at once.
func (d driver) Revoke(ctx context.Context, id string, abandoned bool) error {
	b := d.b
	if abandoned {
		_, err := b.g.apply(ctx, command{Op: opSessionDestroy, Session: id, Reason: reasonExpired, Time: time.Now()})
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, max(b.cfg.RenewInterval, time.Second))
	defer cancel()
	if _, err := b.g.apply(ctx, command{Op: opSessionDestroy, Session: id, Time: time.Now()}); err != nil {
		return fmt.Errorf("raft: destroy session %s (its leases expire after the TTL instead): %w", id, err)
	}
	return nil
}

// Gone implements backend.SessionDriver.
func (driver) Gone(err error) bool { return errors.Is(err, errSessionGone) }

// resignRequested passes on to the terms of session sid the resign
// requests the group holds for them (Node.RequestResign): it asks, and
// nothing more. The term goes on, renewed, while its holder stops its
// work; the holder's Resign then releases the lease
// (baton.ResignRequestTerm), so nobody else gets it before the work
// stopped. An order for a term not (or no longer) ours is ignored; the
// group repeats an order with each renewal until the lease is released.
func (b *Backend) resignRequested(sid string, orders []resignOrder) {
	for _, o := range orders {
		t := b.sessions.Term(o.Lease)
		if t == nil || t.Token() != o.Token {
			continue
		}
		if t.RequestResign(fmt.Errorf("%w: lease %q (token %d): resign requested via the group API", baton.ErrResigned, o.Lease, o.Token)) {
			b.log.Info("resign requested via the group API: asking the holder to stop, then release", "lease", o.Lease, "token", o.Token, "session", sid)
		}
	}
}
