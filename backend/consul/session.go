package consul

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

// sess is the Backend's Consul session and the baton leases riding on it.
//
// api.Session.RenewPeriodic is not used: it keeps no safe-until (it renews
// at TTL/2 and gives up only a full TTL after the last success), and
// safe-until must be measured from the send time of the last confirmed
// renewal.
type sess = backend.Session[string]

// driver is the Backend's backend.SessionDriver: a Consul session per session.
type driver struct{ b *Backend }

var _ backend.SessionDriver[string] = driver{}

// newSessions returns the Manager of b's sessions.
func newSessions(b *Backend) *backend.SessionManager[string] {
	return backend.NewSessionManager(driver{b}, backend.SessionOptions[string]{
		Backend: "consul",
		Config:  b.cfg,
		// An unreachable agent holds requests rather than failing them.
		GrantTimeout: b.reqTimeout,
		// By then Consul has invalidated the session anyway.
		AbandonFor: 2 * b.sessTTL,
		Describe:   func(id string) string { return "consul session " + id },
		Lost:       "was invalidated on the server (TTL ran out, it was destroyed, or one of its health checks failed)",
		Unavailable: func(ctx context.Context, what string, err error) error {
			return b.unavailable(ctx, what, err)
		},
		Log: b.log,
	})
}

// Grant implements backend.SessionDriver.
func (d driver) Grant(ctx context.Context) (backend.SessionGrant[string], error) {
	b := d.b
	start := time.Now()
	id, err := b.createSession(ctx)
	if err != nil {
		return backend.SessionGrant[string]{}, err
	}
	b.log.Debug("session created", "session", id, "ttl", b.sessTTL, "lock_delay", b.lockDelay)
	return backend.SessionGrant[string]{
		ID: id, SafeUntil: b.cfg.SafeUntil(start, b.sessTTL), TTL: b.sessTTL, Span: b.sessTTL - b.cfg.DriftMargin,
	}, nil
}

// Renew implements backend.SessionDriver.
func (d driver) Renew(ctx context.Context, id string) (time.Time, error) {
	until, _, err := d.b.renewOnce(ctx, id)
	return until, err
}

// Revoke implements backend.SessionDriver: it destroys the session, bounded like
// every other request, should ctx have no deadline.
func (d driver) Revoke(ctx context.Context, id string, _ bool) error {
	ctx, cancel := context.WithTimeout(ctx, d.b.reqTimeout)
	defer cancel()
	if _, err := d.b.client.Session().Destroy(id, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("destroy session %s (it expires after twice its TTL, %s): %w", id, 2*d.b.sessTTL, err)
	}
	d.b.sweepTombs(ctx, id)
	return nil
}

// Gone implements backend.SessionDriver.
func (driver) Gone(err error) bool { return errors.Is(err, errSessionGone) }

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

// alive reports whether Consul still knows session s.
func (b *Backend) alive(ctx context.Context, s *sess) (bool, error) {
	ctx, end, err := b.request(ctx)
	if err != nil {
		return false, err
	}
	defer end()
	info, _, err := b.client.Session().Info(s.ID, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return false, permissionErr(err)
	}
	return info != nil, nil
}

// durationMs formats d for Consul in whole milliseconds, rounded up.
func durationMs(d time.Duration) string {
	return fmt.Sprintf("%dms", (d+time.Millisecond-1)/time.Millisecond)
}
