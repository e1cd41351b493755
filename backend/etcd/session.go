package etcd

import (
	"context"
	"errors"
	"fmt"

	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/renew"
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

	*renew.Terms // safe-until and the live terms, extended by each renewal
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
	s = &session{id: resp.ID, ctx: sctx, cancel: cancel, Terms: renew.New(safeUntil)}
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

// keepAlive renews s every RenewInterval until it ends.
func (b *Backend) keepAlive(s *session) {
	defer b.wg.Done()
	s.KeepAlive(s.ctx, renew.Renewal{
		Interval: b.cfg.RenewInterval,
		Renew: func(ctx context.Context) (time.Time, error) {
			start := time.Now()
			resp, err := b.client.KeepAliveOnce(ctx, s.id)
			if err != nil {
				return time.Time{}, err
			}
			return b.cfg.SafeUntil(start, time.Duration(resp.TTL)*time.Second), nil
		},
		Gone:    isLeaseNotFound,
		Expired: func(lastErr error) { b.expire(s, lastErr) },
		Lost:    func(error) { b.endSession(s, b.lostErr(s)) },
		Failed: func(err error, left time.Duration) {
			b.log.Warn("session renewal failed; retrying", "session", fmt.Sprintf("%x", s.id), "err", err,
				"safe_until_in", left.Round(time.Millisecond))
		},
	})
}

// lostErr is why s's terms end when etcd reports s gone.
func (b *Backend) lostErr(s *session) error {
	b.log.Warn("etcd reports the session gone (expired or revoked)", "session", fmt.Sprintf("%x", s.id))
	return fmt.Errorf("%w: etcd session %x expired or was revoked on the server", baton.ErrLeaseLost, s.id)
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
	b.mu.Lock()
	if b.sess == s {
		b.sess = nil
	}
	b.mu.Unlock()
	// End the terms before cancelling s.ctx, which lets their watchers
	// give up the lease names: a name must not be free while its term lasts.
	s.End(err)
	s.cancel()
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound)
}
