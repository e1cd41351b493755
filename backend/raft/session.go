package raft

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/renew"
)

// session is this Backend's session in the group and the terms riding on
// it. The raft leader expires it TTL after the last renewal it confirmed;
// safe-until is measured from when that renewal was sent.
type session struct {
	id     string
	ctx    context.Context // cancelled when the session ends
	cancel context.CancelFunc

	*renew.Terms // safe-until and the live terms, extended by each renewal
}

// bound returns a context that ends with ctx or with the session.
func (s *session) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	return c, func() { stop(); cancel() }
}

// session returns the live session, creating one first if there is none.
func (b *Backend) session(ctx context.Context) (*session, error) {
	select {
	case b.creating <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-b.creating }()
	b.mu.Lock()
	closed, s := b.closed, b.sess
	b.mu.Unlock()
	if closed {
		return nil, baton.ErrClosed
	}
	if s != nil && s.ctx.Err() == nil {
		return s, nil
	}
	// Bounded, so that a group without a leader shows up as
	// ErrBackendUnavailable (the Elector logs it and retries) rather than a
	// silent wait.
	cctx, cancel := context.WithTimeout(ctx, max(b.cfg.TTL, 5*time.Second))
	defer cancel()
	id := randomID("s-")
	start := time.Now()
	res, err := b.g.apply(cctx, command{Op: opSessionCreate, Session: id, Node: b.g.member(), TTL: b.cfg.TTL, Time: start})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: create session: %w", baton.ErrBackendUnavailable, err)
	}
	if res.Err != "" {
		return nil, fmt.Errorf("%w: create session: %s", baton.ErrBackendUnavailable, res.Err)
	}
	safeUntil := b.cfg.SafeUntil(start, b.cfg.TTL)
	// A create that waited out an election may come back with its
	// safe-until half spent; nothing rides on it yet, so renew it now.
	if time.Until(safeUntil) < (b.cfg.TTL-b.cfg.DriftMargin)/2 {
		start = time.Now()
		r, err := b.g.renew(cctx, id)
		if err != nil {
			return nil, fmt.Errorf("%w: renew new session: %w", baton.ErrBackendUnavailable, err)
		}
		safeUntil = b.cfg.SafeUntil(start, r.TTL)
	}
	sctx, scancel := context.WithCancel(b.ctx)
	s = &session{id: id, ctx: sctx, cancel: scancel, Terms: renew.New(safeUntil)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		scancel()
		dctx, dcancel := context.WithTimeout(context.Background(), b.cfg.RenewInterval)
		_, _ = b.g.apply(dctx, command{Op: opSessionDestroy, Session: id, Time: time.Now()})
		dcancel()
		return nil, baton.ErrClosed
	}
	b.sess = s
	b.wg.Add(1)
	b.mu.Unlock()
	go b.keepAlive(s)
	b.log.Debug("session created", "session", id, "member", b.g.member(), "ttl", b.cfg.TTL)
	return s, nil
}

// keepAlive renews s every RenewInterval until it ends.
func (b *Backend) keepAlive(s *session) {
	defer b.wg.Done()
	s.KeepAlive(s.ctx, renew.Renewal{
		Interval: b.cfg.RenewInterval,
		Renew: func(ctx context.Context) (time.Time, error) {
			start := time.Now()
			r, err := b.g.renew(ctx, s.id)
			if err != nil {
				return time.Time{}, err
			}
			if len(r.Resign) > 0 {
				b.resignRequested(s, r.Resign)
			}
			return b.cfg.SafeUntil(start, r.TTL), nil
		},
		Gone:    func(err error) bool { return errors.Is(err, errSessionGone) },
		Expired: func(lastErr error) { b.expire(s, lastErr) },
		Lost:    func(error) { b.endSession(s, b.lostErr(s)) },
		Failed: func(err error, left time.Duration) {
			b.log.Warn("session renewal failed; retrying", "session", s.id, "err", err,
				"safe_until_in", left.Round(time.Millisecond))
		},
	})
}

func (b *Backend) lostErr(s *session) error {
	b.log.Warn("the group expired this session", "session", s.id)
	return fmt.Errorf("%w: session %s expired in the group (renewals did not reach the raft leader in time)", baton.ErrLeaseLost, s.id)
}

// expire ends s at its safe-until. The group may still have the session
// (and our leases): destroy it in the background rather than let it block
// other candidates until the raft leader expires it.
func (b *Backend) expire(s *session, lastErr error) {
	err := fmt.Errorf("%w: session %s not renewed in time", baton.ErrExpired, s.id)
	if lastErr != nil {
		err = fmt.Errorf("%w: session %s not renewed in time (last renewal error: %w)", baton.ErrExpired, s.id, lastErr)
	}
	b.log.Warn("session expired before a renewal was confirmed; starting afresh", "session", s.id, "err", lastErr)
	b.endSession(s, err)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, b.cfg.TTL)
		defer cancel()
		_, _ = b.g.apply(ctx, command{Op: opSessionDestroy, Session: s.id, Reason: reasonExpired, Time: time.Now()})
	}()
}

// resignRequested passes on to the terms of s the resign requests the
// group holds for them (Node.RequestResign): it asks, and nothing more. The
// term goes on, renewed, while its holder stops its work; the holder's
// Resign then releases the lease (baton.ResignRequestTerm), so nobody else
// gets it before the work stopped. An order for a term not (or no longer)
// ours is ignored; the group repeats an order with each renewal until the
// lease is released.
func (b *Backend) resignRequested(s *session, orders []resignOrder) {
	for _, o := range orders {
		b.mu.Lock()
		var t *backend.BasicTerm
		if sl := b.slots[o.Lease]; sl != nil {
			t = sl.term
		}
		b.mu.Unlock()
		if t == nil || t.Token() != o.Token {
			continue
		}
		if t.RequestResign(fmt.Errorf("%w: lease %q (token %d): resign requested via the group API", baton.ErrResigned, o.Lease, o.Token)) {
			b.log.Info("resign requested via the group API: asking the holder to stop, then release", "lease", o.Lease, "token", o.Token, "session", s.id)
		}
	}
}

// endSession ends s and its terms with err. New campaigns get a new session.
func (b *Backend) endSession(s *session, err error) {
	b.mu.Lock()
	if b.sess == s {
		b.sess = nil
	}
	b.mu.Unlock()
	s.End(err)
	s.cancel()
}
