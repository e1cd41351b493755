package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// session is one etcd lease and the baton leases riding on it.
//
// concurrency.Session is not used: its keep-alive replies do not say when
// the renewal they answer was sent, and safe-until must be measured from the
// send time of the last confirmed renewal.
type session struct {
	id clientv3.LeaseID
	// ctx is cancelled when the session ends, stopping everything that
	// works on its behalf.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	safeUntil time.Time
	terms     map[*held]struct{} // live terms, extended by each renewal
	lastErr   error              // the latest renewal failure, nil after a success
	err       error              // why the session ended; nil while it lasts
}

// endedErr returns why the session ended, or nil while it lasts.
func (s *session) endedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// forget stops extending h, whose term has ended.
func (s *session) forget(h *held) {
	s.mu.Lock()
	delete(s.terms, h)
	s.mu.Unlock()
}

// session returns the live session, granting one first if there is none.
func (b *Backend) session(ctx context.Context) (*session, error) {
	select {
	case b.granting <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-b.granting }()
	b.mu.Lock()
	closed, s := b.closed, b.sess
	b.mu.Unlock()
	if closed {
		return nil, baton.ErrClosed
	}
	if s != nil && s.ctx.Err() == nil {
		return s, nil
	}
	// The client waits for a connection rather than failing, so an
	// unreachable etcd would block here silently; bound the grant so the
	// caller (the Elector) sees ErrBackendUnavailable, logs it and retries.
	// Not below 5 s: gRPC's reconnect back-off after a partition heals can
	// take a few seconds by itself.
	gctx, gcancel := context.WithTimeout(ctx, max(b.cfg.TTL, 5*time.Second))
	defer gcancel()
	start := time.Now()
	resp, err := b.client.Grant(gctx, b.ttlSec)
	if err != nil {
		return nil, b.unavailable(ctx, "grant session lease", err)
	}
	ttl := time.Duration(resp.TTL) * time.Second
	safeUntil := b.cfg.SafeUntil(start, ttl)
	// A grant sent while the client was reconnecting may return with its
	// safe-until all but spent. Nothing rides on the session yet, so a
	// renewal now gives it a full term, measured from this send.
	for tries := 0; time.Until(safeUntil) < (ttl-b.cfg.DriftMargin)/2; tries++ {
		if tries == 3 {
			b.revokeLater(resp.ID)
			return nil, fmt.Errorf("%w: etcd confirms session renewals too slowly for a TTL of %s", baton.ErrBackendUnavailable, ttl)
		}
		start := time.Now()
		ka, err := b.client.KeepAliveOnce(gctx, resp.ID)
		if err != nil {
			b.revokeLater(resp.ID)
			return nil, b.unavailable(ctx, "renew new session lease", err)
		}
		safeUntil = b.cfg.SafeUntil(start, time.Duration(ka.TTL)*time.Second)
	}
	sctx, cancel := context.WithCancel(b.ctx)
	s = &session{
		id:        resp.ID,
		ctx:       sctx,
		cancel:    cancel,
		safeUntil: safeUntil,
		terms:     map[*held]struct{}{},
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		rctx, rcancel := context.WithTimeout(context.Background(), b.cfg.RenewInterval)
		_, _ = b.client.Revoke(rctx, resp.ID) // else it expires unused after its TTL
		rcancel()
		return nil, baton.ErrClosed
	}
	b.sess = s
	b.wg.Add(1)
	b.mu.Unlock()
	go b.keepAlive(s)
	b.log.Debug("session granted", "session", fmt.Sprintf("%x", s.id), "ttl", ttl)
	if ttl > b.cfg.TTL+time.Second {
		b.log.Info("etcd granted a longer TTL than asked: failover will take longer", "asked", b.cfg.TTL, "granted", ttl)
	}
	return s, nil
}

// keepAlive renews s every RenewInterval until it ends. Each renewal is
// bounded by the current safe-until, after which it would be useless.
func (b *Backend) keepAlive(s *session) {
	defer b.wg.Done()
	next := s.renewIn(b.cfg.RenewInterval)
	for {
		timer := time.NewTimer(next)
		select {
		case <-s.ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		s.mu.Lock()
		deadline, lastErr := s.safeUntil, s.lastErr
		s.mu.Unlock()
		if !time.Now().Before(deadline) {
			b.expire(s, lastErr)
			return
		}
		ctx, cancel := context.WithDeadline(s.ctx, deadline)
		start := time.Now()
		resp, err := b.client.KeepAliveOnce(ctx, s.id)
		cancel()
		switch {
		case err == nil:
			s.extend(b.cfg.SafeUntil(start, time.Duration(resp.TTL)*time.Second))
			next = s.renewIn(b.cfg.RenewInterval)
		case isLeaseNotFound(err):
			b.endSession(s, b.lostErr(s))
			return
		case s.ctx.Err() != nil:
			return
		default:
			s.renewFailed(err)
			b.log.Warn("session renewal failed; retrying", "session", fmt.Sprintf("%x", s.id), "err", err,
				"safe_until_in", time.Until(deadline).Round(time.Millisecond))
			next = s.renewIn(b.cfg.RenewInterval / 4)
		}
	}
}

// renewIn returns how long to wait before the next renewal: interval, but at
// most half the time left before safe-until, so that renewals are still
// tried before the deadline when the last confirmation was slow (a grant
// that waited for a reconnect, say). Past the deadline it returns a moment,
// for keepAlive to notice.
func (s *session) renewIn(interval time.Duration) time.Duration {
	s.mu.Lock()
	left := time.Until(s.safeUntil)
	s.mu.Unlock()
	return max(min(interval, left/2), time.Millisecond)
}

// lostErr is why s's terms end when etcd reports s gone.
func (b *Backend) lostErr(s *session) error {
	b.log.Warn("etcd reports the session gone (expired or revoked)", "session", fmt.Sprintf("%x", s.id))
	return fmt.Errorf("%w: etcd session %x expired or was revoked on the server", baton.ErrLeaseLost, s.id)
}

// extend moves the session's safe-until, and every live term's, to until.
func (s *session) extend(until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until.After(s.safeUntil) {
		s.safeUntil = until
	}
	s.lastErr = nil
	for h := range s.terms {
		if !h.term.Extend(until) {
			delete(s.terms, h)
		}
	}
}

func (s *session) renewFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	for h := range s.terms {
		h.term.RenewFailed(err)
	}
}

// expire ends s at its safe-until and revokes it in the background if it
// can. The session may still be alive on the server, holding our keys:
// renewing it again could not revive the terms, so it is dropped rather
// than left to block other candidates until it expires.
func (b *Backend) expire(s *session, lastErr error) {
	err := fmt.Errorf("%w: etcd session %x not renewed in time", baton.ErrExpired, s.id)
	if lastErr != nil {
		err = fmt.Errorf("%w: etcd session %x not renewed in time (last renewal error: %w)", baton.ErrExpired, s.id, lastErr)
	}
	b.log.Warn("session expired before a renewal was confirmed; starting afresh", "session", fmt.Sprintf("%x", s.id), "err", lastErr)
	b.endSession(s, err)
	b.revokeLater(s.id)
}

// revokeLater revokes lease id in the background, giving up after one TTL,
// by when etcd has expired it anyway.
func (b *Backend) revokeLater(id clientv3.LeaseID) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, time.Duration(b.ttlSec)*time.Second)
		defer cancel()
		if _, err := b.client.Revoke(ctx, id); err != nil && !isLeaseNotFound(err) {
			b.log.Debug("revoking an abandoned session failed; etcd expires it", "session", fmt.Sprintf("%x", id), "err", err)
		}
	}()
}

// endSession ends s and its terms with err. New campaigns get a new session.
func (b *Backend) endSession(s *session, err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	terms := s.terms
	s.terms = nil
	s.mu.Unlock()
	b.mu.Lock()
	if b.sess == s {
		b.sess = nil
	}
	b.mu.Unlock()
	// End the terms before cancelling s.ctx, which lets their watchers
	// give up the lease names: a name must not be free while its term lasts.
	for h := range terms {
		h.term.End(err)
	}
	s.cancel()
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound)
}
