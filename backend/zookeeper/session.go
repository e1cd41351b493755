package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/renew"
	"github.com/go-zookeeper/zk"
)

// session is one generation of the ZooKeeper session the Backend's terms
// ride on: a span over which every renewal was confirmed in time. It ends
// when the server expires the session (the terms are lost), when
// safe-until passes without a confirmed renewal (the terms expire, while
// the session itself may live on and reconnect: the next campaign starts a
// new generation on it, and the old generation's nodes are deleted), or at
// Close.
type session struct {
	id int64 // the ZooKeeper session ID
	// ctx is cancelled when the generation ends, stopping everything that
	// works on its behalf.
	ctx    context.Context
	cancel context.CancelFunc
	// timeout is the negotiated session timeout the last renewal was timed
	// by, in nanoseconds.
	timeout atomic.Int64

	*renew.Terms // safe-until and the live terms, extended by each renewal
}

var (
	// errSessionGone is a renewal's verdict when the client holds another
	// session than the generation's: the server expired ours.
	errSessionGone = errors.New("zookeeper: the client's session changed: the server expired the old one")
	// errDisconnected fails a renewal at once while the client has no
	// connection, rather than queueing a request that would only be sent
	// after the reconnection.
	errDisconnected = errors.New("zookeeper: not connected")
	// errTimeoutCut is a renewal's verdict when the server granted a
	// shorter session timeout on reconnection; the generation has ended.
	errTimeoutCut = errors.New("zookeeper: session timeout cut on reconnection")
)

// session returns the live session generation, starting one first if
// there is none.
func (b *Backend) session(ctx context.Context) (*session, error) {
	select {
	case b.starting <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-b.starting }()
	b.mu.Lock()
	closed, s := b.closed, b.sess
	b.mu.Unlock()
	if closed {
		return nil, baton.ErrClosed
	}
	if s != nil && s.ctx.Err() == nil {
		if b.conn.SessionID() == s.id {
			return s, nil
		}
		// The client found the session expired (and reset its ID, or made
		// another) before our renewals noticed.
		b.endSession(s, b.lostErr(s))
	}
	// Not below 5 s: a client reconnecting after a partition healed may
	// take a few attempts before it is back.
	gctx, cancel := context.WithTimeout(ctx, max(b.cfg.TTL, 5*time.Second))
	defer cancel()
	var (
		id        int64
		timeout   time.Duration
		safeUntil time.Time
	)
	for tries := 0; ; tries++ {
		start := time.Now()
		sid := b.conn.SessionID()
		err := b.confirm(gctx)
		if err != nil {
			if errors.Is(err, baton.ErrClosed) {
				return nil, err
			}
			if gctx.Err() != nil {
				return nil, b.unavailable(ctx, "start a ZooKeeper session", err)
			}
			// The client failed the request while (re)connecting: try
			// again shortly.
			select {
			case <-gctx.Done():
				return nil, b.unavailable(ctx, "start a ZooKeeper session", err)
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		// The reply confirms the session from the request's send time only
		// if the request went out on it: the client may have connected, or
		// found its session expired and made another, while it waited.
		if sid == 0 || b.conn.SessionID() != sid {
			continue
		}
		id = sid
		var known bool
		if timeout, known = b.sessionTimeout(sid); !known {
			if b.conn.SessionID() != sid {
				continue // the client has another session since: measure again
			}
			return nil, fmt.Errorf("%w: Options.Probe has not seen ZooKeeper session 0x%x being granted, so the negotiated session timeout is unknown: dial the connection with the probe's Dial (zk.WithDialer(probe.Dial)), or leave Probe nil",
				baton.ErrBackendUnavailable, sid)
		}
		if timeout <= b.cfg.DriftMargin {
			return nil, fmt.Errorf("%w: ZooKeeper granted a session timeout of %s, no more than DriftMargin (%s): no lease could be held safely; lower DriftMargin or raise the server's minSessionTimeout",
				baton.ErrBackendUnavailable, timeout, b.cfg.DriftMargin)
		}
		if safeWindow(b.cfg, timeout) <= 0 {
			return nil, fmt.Errorf("%w: ZooKeeper granted a session timeout of %s, too short for RenewInterval %s and DriftMargin %s: a renewal would confirm nothing beyond the next one (see the package doc); ask for a TTL within the servers' [minSessionTimeout, maxSessionTimeout], or shorten RenewInterval",
				baton.ErrBackendUnavailable, timeout, b.cfg.RenewInterval, b.cfg.DriftMargin)
		}
		safeUntil = b.cfg.SafeUntil(start.Add(-ensembleLag(b.cfg, timeout)), timeout)
		// A reply that took long leaves little of the term: nothing rides
		// on the generation yet, so measure again.
		if time.Until(safeUntil) >= (timeout-ensembleLag(b.cfg, timeout)-b.cfg.DriftMargin)/2 {
			break
		}
		if tries >= 3 {
			return nil, fmt.Errorf("%w: ZooKeeper answers too slowly for a session timeout of %s", baton.ErrBackendUnavailable, timeout)
		}
	}
	sctx, scancel := context.WithCancel(b.ctx)
	s = &session{id: id, ctx: sctx, cancel: scancel, Terms: renew.New(safeUntil)}
	s.timeout.Store(int64(timeout))
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		scancel()
		return nil, baton.ErrClosed
	}
	b.sess = s
	b.wg.Add(1)
	b.mu.Unlock()
	go b.keepAlive(s)
	b.log.Debug("session generation started", "session", fmt.Sprintf("0x%x", id), "timeout", timeout)
	if timeout != b.cfg.TTL {
		b.log.Info("ZooKeeper negotiated a session timeout other than the TTL; safe-until is timed by it",
			"session", fmt.Sprintf("0x%x", id), "ttl", b.cfg.TTL, "negotiated", timeout)
	}
	return s, nil
}

// sessionTimeout returns the timeout safe-until is timed by for session
// sid: without a probe the TTL; with one, the timeout the probe saw the
// server grant sid, and false when the probe has not seen sid (it has seen
// the client get another session since, or the connection was not dialed
// through it). It never falls back to the TTL behind a probe's back: the
// server may have granted less.
func (b *Backend) sessionTimeout(sid int64) (time.Duration, bool) {
	if b.probe == nil {
		return b.cfg.TTL, true
	}
	return b.probe.Negotiated(sid)
}

// confirm sends one request that confirms the client's session, and
// returns nil when the reply says it is alive. It is a sync, not a read:
// in an ensemble a follower answers reads from its own copy, and keeps
// doing so for up to syncLimit ticks after it lost the leader, which
// expires sessions meanwhile; a sync goes through the leader, which
// checks the session before it answers (PrepRequestProcessor), so its
// reply means the client's server follows a live leader that still holds
// the session. On a standalone server the two cost the same.
func (b *Backend) confirm(ctx context.Context) error {
	_, err := call(ctx, b, func() (string, error) { return b.conn.Sync("/") })
	return err
}

// keepAlive confirms s every RenewInterval with a sync until it ends. The
// client pings the server on its own too; but its pings' replies are not
// ours to see, and safe-until must be measured from the send time of a
// request whose reply we saw.
func (b *Backend) keepAlive(s *session) {
	defer b.wg.Done()
	s.KeepAlive(s.ctx, renew.Renewal{
		Interval: b.cfg.RenewInterval,
		Renew: func(ctx context.Context) (time.Time, error) {
			// The client resets its session ID only when the server says
			// the session expired, and then makes a new one.
			if b.conn.SessionID() != s.id {
				return time.Time{}, errSessionGone
			}
			if b.conn.State() != zk.StateHasSession {
				return time.Time{}, errDisconnected
			}
			start := time.Now()
			err := b.confirm(ctx)
			if b.conn.SessionID() != s.id {
				return time.Time{}, errSessionGone
			}
			if err != nil {
				return time.Time{}, err
			}
			timeout, known := b.sessionTimeout(s.id)
			if !known {
				// The probe knew s.id when the generation began: it has
				// seen the client get another session since our check.
				return time.Time{}, errSessionGone
			}
			if old := time.Duration(s.timeout.Swap(int64(timeout))); old != timeout {
				b.log.Warn("ZooKeeper renegotiated the session timeout on reconnection; safe-until is timed by the new one",
					"session", fmt.Sprintf("0x%x", s.id), "was", old, "now", timeout)
				if timeout < old {
					// A server of the ensemble with a lower
					// maxSessionTimeout took the client back. It expires
					// the session the new timeout after the reconnection,
					// which can come before the safe-until an earlier
					// renewal promised by the old one; and a promise
					// cannot be taken back (Extend never shortens it). So
					// the generation's terms end now; their nodes are
					// deleted (see watchHeld) and campaigns start afresh.
					b.endSession(s, fmt.Errorf("%w: ZooKeeper session 0x%x: the server cut its timeout from %s to %s on reconnection, which could end it before the safe-until already given",
						baton.ErrExpired, s.id, old, timeout))
					return time.Time{}, errTimeoutCut // KeepAlive returns: s.ctx has ended
				}
			}
			// Measured from before the send time: see ensembleLag.
			return b.cfg.SafeUntil(start.Add(-ensembleLag(b.cfg, timeout)), timeout), nil
		},
		Gone: func(err error) bool {
			return errors.Is(err, errSessionGone) || errors.Is(err, zk.ErrSessionExpired)
		},
		Expired: func(lastErr error) { b.expire(s, lastErr) },
		Lost:    func(error) { b.endSession(s, b.lostErr(s)) },
		Failed: func(err error, left time.Duration) {
			b.log.Warn("session renewal failed; retrying", "session", fmt.Sprintf("0x%x", s.id), "err", err,
				"safe_until_in", left.Round(time.Millisecond))
		},
	})
}

// lostErr is why s's terms end when the server expired the session.
func (b *Backend) lostErr(s *session) error {
	b.log.Warn("ZooKeeper expired the session", "session", fmt.Sprintf("0x%x", s.id))
	return fmt.Errorf("%w: ZooKeeper session 0x%x expired on the server", baton.ErrLeaseLost, s.id)
}

// expire ends s at its safe-until. The session may still be alive on the
// server and reconnect, but renewing it again could not revive the terms:
// their holders have stopped. So the generation ends, its nodes are
// deleted (see watchHeld) rather than left to block other candidates until
// the session expires, and the next campaign starts a new generation.
func (b *Backend) expire(s *session, lastErr error) {
	err := fmt.Errorf("%w: ZooKeeper session 0x%x not confirmed in time", baton.ErrExpired, s.id)
	if lastErr != nil {
		err = fmt.Errorf("%w: ZooKeeper session 0x%x not confirmed in time (last renewal error: %w)", baton.ErrExpired, s.id, lastErr)
	}
	b.log.Warn("session not confirmed before safe-until; its terms end", "session", fmt.Sprintf("0x%x", s.id), "err", lastErr)
	b.endSession(s, err)
}

// endSession ends s and its terms with err. New campaigns get a new
// generation.
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
