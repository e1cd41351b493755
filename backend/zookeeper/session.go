package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// sess is one generation of the ZooKeeper session the Backend's terms
// ride on: a span over which every renewal was confirmed in time. It ends
// when the server expires the session (the terms are lost), when
// safe-until passes without a confirmed renewal (the terms expire, while
// the session itself may live on and reconnect: the next campaign starts a
// new generation on it, and the old generation's nodes are deleted), or at
// Close.
type sess = backend.Session[*gen]

// gen names a session generation.
type gen struct {
	id int64 // the ZooKeeper session ID
	// timeout is the negotiated session timeout the last renewal was timed
	// by, in nanoseconds.
	timeout atomic.Int64
	// standalone says the generation began on a standalone server;
	// ridePings, that its renewals ride on the client's pings there, every
	// interval (a third of the timeout, go-zookeeper's ping interval).
	// interval is the time between renewals, which bounds the ensemble lag.
	standalone, ridePings bool
	interval              time.Duration
	// answered is the send time of the latest answered request a renewal
	// returned. Renewals run one at a time.
	answered time.Time
}

// driver is the Backend's backend.SessionDriver: generations of the connection's
// one session, confirmed with syncs. The client pings the server on its
// own too; but its pings' replies are not ours to see, and safe-until must
// be measured from the send time of a request whose reply we saw.
type driver struct{ b *Backend }

var (
	_ backend.SessionDriver[*gen]  = driver{}
	_ backend.SessionChecker[*gen] = driver{}
)

// newSessions returns the Manager of b's session generations.
func newSessions(b *Backend) *backend.SessionManager[*gen] {
	return backend.NewSessionManager(driver{b}, backend.SessionOptions[*gen]{
		Backend: "ZooKeeper",
		Config:  b.cfg,
		// Not below 5 s: a client reconnecting after a partition healed
		// may take a few attempts before it is back.
		GrantTimeout: max(b.cfg.TTL, 5*time.Second),
		AbandonFor:   b.cfg.TTL,
		Describe:     func(g *gen) string { return fmt.Sprintf("ZooKeeper session 0x%x", g.id) },
		Lost:         "expired on the server",
		Log:          b.log,
	})
}

var (
	// errSessionGone is a renewal's verdict when the client holds another
	// session than the generation's: the server expired ours.
	errSessionGone = errors.New("zookeeper: the client's session changed: the server expired the old one")
	// errDisconnected fails a renewal at once while the client has no
	// connection, rather than queueing a request that would only be sent
	// after the reconnection.
	errDisconnected = errors.New("zookeeper: not connected")
)

// Current implements backend.SessionChecker: the client may have found the
// session expired (and reset its ID, or made another) before our renewals
// noticed.
func (d driver) Current(g *gen) bool { return d.b.conn.SessionID() == g.id }

// Grant implements backend.SessionDriver: it starts a generation on the client's
// session, with a confirmation whose request went out on it.
func (d driver) Grant(ctx context.Context) (backend.SessionGrant[*gen], error) {
	b := d.b
	for tries := 0; ; tries++ {
		start := time.Now()
		sid := b.conn.SessionID()
		before, _ := b.link(sid)
		if err := b.confirm(ctx); err != nil {
			if errors.Is(err, baton.ErrClosed) || ctx.Err() != nil {
				return backend.SessionGrant[*gen]{}, err
			}
			// The client failed the request while (re)connecting: try
			// again shortly.
			select {
			case <-ctx.Done():
				return backend.SessionGrant[*gen]{}, err
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
		if b.watches != nil && !b.watches.delivered() {
			// The session exists, so the client has called its event
			// callback (with StateHasSession) if it has one.
			return backend.SessionGrant[*gen]{}, fmt.Errorf("%w: Options.Watches has had no event from the connection, so the Backend would not see a held lease's node deleted: pass zk.WithEventCallback(watches.Callback) to zk.Connect, or leave Watches nil",
				baton.ErrBackendUnavailable)
		}
		timeout, known := b.sessionTimeout(sid)
		if !known {
			if b.conn.SessionID() != sid {
				continue // the client has another session since: measure again
			}
			return backend.SessionGrant[*gen]{}, fmt.Errorf("%w: Options.Probe has not seen ZooKeeper session 0x%x being granted, so the negotiated session timeout is unknown: dial the connection with the probe's Dial (zk.WithDialer(probe.Dial)), or leave Probe nil",
				baton.ErrBackendUnavailable, sid)
		}
		// A server that granted more than asked (its minSessionTimeout is
		// above the TTL) keeps the session longer, but safe-until never
		// reaches past the client's own TTL (backend.Config.SafeUntil): the
		// terms are timed by the shorter of the two.
		timed := min(timeout, b.cfg.TTL)
		if err := b.checkTimeout(timed); err != nil {
			return backend.SessionGrant[*gen]{}, err
		}
		id := &gen{id: sid, interval: b.cfg.RenewInterval}
		lag := ensembleLag(id.interval, timeout)
		if after, _ := b.link(sid); before.standalone && after.seq == before.seq {
			id.standalone, lag = true, 0
			// The client pings every third of the negotiated timeout: too
			// seldom for a term timed by a shorter TTL.
			if b.ridePings && timeout <= b.cfg.TTL {
				id.ridePings, id.interval = true, timeout/3
			}
		}
		g := backend.SessionGrant[*gen]{
			ID:        id,
			SafeUntil: b.cfg.SafeUntil(start.Add(-lag), timeout),
			TTL:       timeout,
			Span:      timed - lag - b.cfg.DriftMargin,
			Interval:  id.interval,
		}
		id.answered = start
		id.timeout.Store(int64(timeout))
		// A reply that took long leaves little of the term: nothing rides
		// on the generation yet, so measure again.
		if time.Until(g.SafeUntil) >= g.Span/2 {
			b.log.Debug("session generation started", "session", fmt.Sprintf("0x%x", sid), "timeout", timeout,
				"standalone", id.standalone, "renew_interval", id.interval)
			if timeout != b.cfg.TTL {
				b.log.Info("ZooKeeper negotiated a session timeout other than the TTL; safe-until is timed by it",
					"session", fmt.Sprintf("0x%x", sid), "ttl", b.cfg.TTL, "negotiated", timeout)
			}
			return g, nil
		}
		if tries >= 3 {
			return backend.SessionGrant[*gen]{}, fmt.Errorf("%w: ZooKeeper answers too slowly for a session timeout of %s", baton.ErrBackendUnavailable, timeout)
		}
	}
}

// checkTimeout reports whether a negotiated session timeout leaves room
// to hold a lease safely: if not, a *SessionTimeoutError.
func (b *Backend) checkTimeout(timeout time.Duration) error {
	if timeout <= b.cfg.DriftMargin || safeWindow(b.cfg, timeout) <= 0 {
		return &SessionTimeoutError{TTL: b.cfg.TTL, Negotiated: timeout, RenewInterval: b.cfg.RenewInterval, DriftMargin: b.cfg.DriftMargin}
	}
	return nil
}

// SessionTimeoutError is returned (wrapped) by Campaign when the session
// timeout ZooKeeper negotiated leaves no room to hold a lease safely: the
// server clamped the TTL asked for into its [minSessionTimeout,
// maxSessionTimeout] (by default 2 to 20 of its ticks), and the result is
// too short for RenewInterval and DriftMargin (see the package doc). A TTL
// above maxSessionTimeout, with the default RenewInterval of TTL/6, is the
// common case. Retrying cannot fix it, so it also matches
// *baton.ConfigError with errors.As, and the Elector returns it instead of
// campaigning again.
type SessionTimeoutError struct {
	// TTL is the session timeout asked for; Negotiated is what the server
	// granted.
	TTL, Negotiated time.Duration
	// RenewInterval and DriftMargin are the Backend's.
	RenewInterval, DriftMargin time.Duration
}

// Error implements error.
func (e *SessionTimeoutError) Error() string {
	fix := "ask for a TTL within the servers' [minSessionTimeout, maxSessionTimeout], or shorten RenewInterval and DriftMargin"
	if e.Negotiated < e.TTL {
		fix = fmt.Sprintf("lower TTL to at most %s (the servers' maxSessionTimeout), or raise maxSessionTimeout in the servers' zoo.cfg", e.Negotiated)
	}
	return fmt.Sprintf("zookeeper: the server granted a session timeout of %s for TTL %s, too short to hold a lease with RenewInterval %s and DriftMargin %s (a renewal would confirm nothing beyond the next one; see the package doc): %s",
		e.Negotiated, e.TTL, e.RenewInterval, e.DriftMargin, fix)
}

// Unwrap returns the *baton.ConfigError this is.
func (e *SessionTimeoutError) Unwrap() error {
	return &baton.ConfigError{Problems: []string{e.Error()}}
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

// Renew implements backend.SessionDriver. On a standalone server, with
// RenewInterval left at its default, it confirms generation g with the
// latest request the server answered since the last renewal, which is the
// client's own ping unless other requests flowed; if none comes within
// half an interval, and on an ensemble always, it sends a sync.
func (d driver) Renew(ctx context.Context, g *gen) (time.Time, error) {
	b := d.b
	// The client resets its session ID only when the server says the
	// session expired, and then makes a new one.
	if b.conn.SessionID() != g.id {
		return time.Time{}, errSessionGone
	}
	if b.conn.State() != zk.StateHasSession {
		return time.Time{}, errDisconnected
	}
	if g.ridePings {
		if sent, ok := b.answeredSince(ctx, g); ok {
			return b.renewed(g, sent, 0)
		}
		if ctx.Err() != nil {
			return time.Time{}, ctx.Err()
		}
	}
	start := time.Now()
	before, _ := b.link(g.id)
	err := b.confirm(ctx)
	if b.conn.SessionID() != g.id {
		return time.Time{}, errSessionGone
	}
	if err != nil {
		return time.Time{}, err
	}
	lag := ensembleLag(g.interval, time.Duration(g.timeout.Load()))
	if after, _ := b.link(g.id); g.standalone && before.standalone && after.seq == before.seq {
		lag = 0
	}
	return b.renewed(g, start, lag)
}

// answeredSince waits, within ctx and for at most half of g's interval,
// for the server to answer a request (a ping, most often) that the client
// sent after the last one a renewal of g returned, on a standalone server,
// and returns its send time; false if none came.
func (b *Backend) answeredSince(ctx context.Context, g *gen) (time.Time, bool) {
	timer := time.NewTimer(g.interval / 2)
	defer timer.Stop()
	for {
		l, ok := b.link(g.id)
		if !ok {
			return time.Time{}, false
		}
		if l.standalone && l.answered.After(g.answered) {
			return l.answered, true
		}
		select {
		case <-l.moved:
		case <-timer.C:
			return time.Time{}, false
		case <-ctx.Done():
			return time.Time{}, false
		}
	}
}

// link returns what the probe knows of the connection carrying session
// sid; false without a probe, or when the probe has not seen sid granted.
func (b *Backend) link(sid int64) (link, bool) {
	if b.probe == nil {
		return link{}, false
	}
	return b.probe.link(sid)
}

// renewed ends a renewal of g whose request the client sent at sent and
// the server answered: it checks the session timeout, and returns the
// safe-until, measured from sent less lag.
func (b *Backend) renewed(g *gen, sent time.Time, lag time.Duration) (time.Time, error) {
	if b.conn.SessionID() != g.id {
		return time.Time{}, errSessionGone
	}
	timeout, known := b.sessionTimeout(g.id)
	if !known {
		// The probe knew g.id when the generation began: it has seen the
		// client get another session since our check.
		return time.Time{}, errSessionGone
	}
	if old := time.Duration(g.timeout.Swap(int64(timeout))); old != timeout {
		b.log.Warn("ZooKeeper renegotiated the session timeout on reconnection; safe-until is timed by the new one",
			"session", fmt.Sprintf("0x%x", g.id), "was", old, "now", timeout)
		if timeout < old {
			// A server of the ensemble with a lower maxSessionTimeout took
			// the client back. It expires the session the new timeout
			// after the reconnection, which can come before the safe-until
			// an earlier renewal promised by the old one; and a promise
			// cannot be taken back (Extend never shortens it). So the
			// generation's terms end now; their nodes are deleted (see
			// ended) and campaigns start afresh.
			return time.Time{}, &backend.SessionEndedError{Err: fmt.Errorf("%w: ZooKeeper session 0x%x: the server cut its timeout from %s to %s on reconnection, which could end it before the safe-until already given",
				baton.ErrExpired, g.id, old, timeout)}
		}
	}
	if sent.After(g.answered) {
		g.answered = sent
	}
	// Measured from before the send time: see ensembleLag.
	return b.cfg.SafeUntil(sent.Add(-lag), timeout), nil
}

// Revoke implements backend.SessionDriver. A generation has nothing to revoke on
// the server: the session lives on for the next one, and the nodes of the
// generation that ended are deleted (see ended); Close closes the
// session of a connection it owns.
func (driver) Revoke(context.Context, *gen, bool) error { return nil }

// Gone implements backend.SessionDriver.
func (driver) Gone(err error) bool {
	return errors.Is(err, errSessionGone) || errors.Is(err, zk.ErrSessionExpired)
}
