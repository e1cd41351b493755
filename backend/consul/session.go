package consul

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/renew"
	"github.com/hashicorp/consul/api"
)

// session is one Consul session and the baton leases riding on it.
//
// api.Session.RenewPeriodic is not used: it keeps no safe-until (it renews
// at TTL/2 and gives up only a full TTL after the last success), and
// safe-until must be measured from the send time of the last confirmed
// renewal.
type session struct {
	id  string
	ttl time.Duration // as Consul granted it
	// ctx is cancelled when the session ends, stopping everything that
	// works on its behalf.
	ctx    context.Context
	cancel context.CancelFunc

	*renew.Terms // safe-until and the live terms, extended by each renewal
}

// session returns the live session, creating one first if there is none.
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
	// An unreachable agent holds requests rather than failing them; bound
	// the create so that the caller (the Elector) sees
	// ErrBackendUnavailable, logs it and retries.
	cctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	start := time.Now()
	id, err := b.createSession(cctx)
	if err != nil {
		return nil, b.unavailable(ctx, "create session", err)
	}
	ttl := b.sessTTL
	safeUntil := b.cfg.SafeUntil(start, ttl)
	// A create that took long leaves little of its promise; nothing rides
	// on the session yet, so a renewal now gives it a full one.
	for tries := 0; time.Until(safeUntil) < (ttl-b.cfg.DriftMargin)/2; tries++ {
		if tries == 3 {
			b.destroyLater(id)
			return nil, fmt.Errorf("%w: consul confirms session renewals too slowly for a session TTL of %s", baton.ErrBackendUnavailable, ttl)
		}
		var until time.Time
		until, ttl, err = b.renewOnce(cctx, id)
		if err != nil {
			b.destroyLater(id)
			return nil, b.unavailable(ctx, "renew new session", err)
		}
		safeUntil = until
	}
	sctx, scancel := context.WithCancel(b.ctx)
	s = &session{id: id, ttl: ttl, ctx: sctx, cancel: scancel, Terms: renew.New(safeUntil)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		scancel()
		dctx, dcancel := context.WithTimeout(context.Background(), b.cfg.RenewInterval)
		_, _ = b.client.Session().Destroy(id, (&api.WriteOptions{}).WithContext(dctx)) // else it expires unused
		dcancel()
		return nil, baton.ErrClosed
	}
	b.sess = s
	b.wg.Add(1)
	b.mu.Unlock()
	go b.keepAlive(s)
	b.log.Debug("session created", "session", id, "ttl", ttl, "lock_delay", b.lockDelay)
	return s, nil
}

// createSession creates a session with the Backend's TTL, lock-delay,
// behaviour and checks. The body is written out in full, rather than
// through api.Session.Create, because that omits empty check lists (so
// that the agent adds serfHealth) and a zero lock-delay (so that the agent
// applies 15 s).
func (b *Backend) createSession(ctx context.Context) (string, error) {
	body := map[string]any{
		"Name":       b.sessionName,
		"TTL":        durationMs(b.sessTTL),
		"LockDelay":  durationMs(b.lockDelay),
		"Behavior":   api.SessionBehaviorRelease,
		"NodeChecks": b.nodeChecks, // never nil: [] means none
	}
	if len(b.serviceChecks) > 0 {
		body["ServiceChecks"] = b.serviceChecks
	}
	var out struct{ ID string }
	if _, err := b.client.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		var se api.StatusError
		if errors.As(err, &se) && se.Code == http.StatusInternalServerError && strings.Contains(se.Body, "Session TTL") {
			// The TTL is below the servers' session_ttl_min (or above its
			// maximum, 24 h). Other 500s, such as a missing health check
			// in Checks, speak for themselves.
			return "", &SessionTTLError{SessionTTL: b.sessTTL, Err: err}
		}
		return "", permissionErr(err)
	}
	if out.ID == "" {
		return "", errors.New("consul returned no session ID")
	}
	return out.ID, nil
}

// renewOnce renews session id and returns the new safe-until, measured from
// when the renewal was sent, and the session TTL it is timed by.
//
// Consul resets the session's timer to twice its TTL as it processes the
// renewal (on the leader, after the request was sent), and promises only
// the TTL itself. The safe-until is timed by the TTL we asked for, or by
// the one Consul reports if that is shorter; an answer that is not about
// this session with a TTL is not a confirmation, and extends nothing (it
// is retried as a failed renewal would be).
func (b *Backend) renewOnce(ctx context.Context, id string) (time.Time, time.Duration, error) {
	start := time.Now()
	entry, _, err := b.client.Session().Renew(id, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return time.Time{}, 0, permissionErr(err)
	}
	if entry == nil {
		return time.Time{}, 0, errSessionGone
	}
	ttl, err := time.ParseDuration(entry.TTL)
	if entry.ID != id || err != nil || ttl <= 0 {
		return time.Time{}, 0, fmt.Errorf("consul: renewal of session %s answered for session %q with TTL %q", id, entry.ID, entry.TTL)
	}
	ttl = min(ttl, b.sessTTL)
	return b.cfg.SafeUntil(start, ttl), ttl, nil
}

// keepAlive renews s every RenewInterval until it ends.
func (b *Backend) keepAlive(s *session) {
	defer b.wg.Done()
	s.KeepAlive(s.ctx, renew.Renewal{
		Interval: b.cfg.RenewInterval,
		Renew: func(ctx context.Context) (time.Time, error) {
			until, _, err := b.renewOnce(ctx, s.id)
			return until, err
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

// lostErr is why s's terms end when Consul reports s gone.
func (b *Backend) lostErr(s *session) error {
	b.log.Warn("consul reports the session gone (expired, destroyed, or a health check failed)", "session", s.id)
	return fmt.Errorf("%w: consul session %s was invalidated on the server (TTL ran out, it was destroyed, or one of its health checks failed)",
		baton.ErrLeaseLost, s.id)
}

// expire ends s at its safe-until and destroys it in the background if it
// can. The session may still be alive on the server, holding our keys:
// renewing it again could not revive the terms, so it is dropped rather
// than left to block other candidates until Consul invalidates it.
func (b *Backend) expire(s *session, lastErr error) {
	err := fmt.Errorf("%w: consul session %s not renewed in time", baton.ErrExpired, s.id)
	if lastErr != nil {
		err = fmt.Errorf("%w: consul session %s not renewed in time (last renewal error: %w)", baton.ErrExpired, s.id, lastErr)
	}
	b.log.Warn("session expired before a renewal was confirmed; starting afresh", "session", s.id, "err", lastErr)
	b.endSession(s, err)
	b.destroyLater(s.id)
}

// destroyLater destroys session id in the background, giving up after two
// session TTLs, by when Consul has invalidated it anyway.
func (b *Backend) destroyLater(id string) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, 2*b.sessTTL)
		defer cancel()
		for {
			_, err := b.client.Session().Destroy(id, (&api.WriteOptions{}).WithContext(ctx))
			if err == nil {
				return
			}
			b.log.Debug("destroying an abandoned session failed; retrying", "session", id, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(b.cfg.RenewInterval / 4):
			}
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
	// End the terms before cancelling s.ctx, which stops their watchers
	// and gives up the lease names: a name must not be free while its term
	// lasts.
	s.End(err)
	s.cancel()
}

// alive reports whether Consul still knows session s.
func (b *Backend) alive(ctx context.Context, s *session) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	info, _, err := b.client.Session().Info(s.id, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return false, permissionErr(err)
	}
	return info != nil, nil
}

// durationMs formats d for Consul in whole milliseconds, rounded up.
func durationMs(d time.Duration) string {
	return fmt.Sprintf("%dms", (d+time.Millisecond-1)/time.Millisecond)
}
