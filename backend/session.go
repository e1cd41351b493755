package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/batonhq/baton"
)

// SessionDriver is a backend's requests on its server sessions; ID names one
// session (an etcd lease ID, a Consul session ID, ...). The SessionManager never
// calls it with its mutex held.
type SessionDriver[ID comparable] interface {
	// Grant creates a session, within ctx (bounded by SessionOptions.GrantTimeout).
	// An error that wraps baton.ErrBackendUnavailable or baton.ErrClosed,
	// or matches *baton.ConfigError (a setting the server refuses for
	// good), reaches the campaign as it is; any other through
	// SessionOptions.Unavailable.
	Grant(ctx context.Context) (SessionGrant[ID], error)

	// Renew renews session id once, within ctx (which ends at the current
	// safe-until, or for a new session with SessionOptions.GrantTimeout), and
	// returns the new safe-until, measured from when the
	// renewal was sent. An error Gone reports ends the session with
	// baton.ErrLeaseLost; a *SessionEndedError ends it with its Err; any other is
	// retried, four times as often, until safe-until.
	Renew(ctx context.Context, id ID) (time.Time, error)

	// Revoke ends session id on the server, with one request within ctx.
	// abandoned is true when the SessionManager drops a session the server may
	// still have (its safe-until passed, or it came too slow to confirm):
	// the SessionManager then retries Revoke until it succeeds, Gone reports its
	// error, or SessionOptions.AbandonFor passed. At Close it is false.
	Revoke(ctx context.Context, id ID, abandoned bool) error

	// Gone reports whether err, from Renew or Revoke, says that the server
	// no longer has the session.
	Gone(err error) bool
}

// SessionChecker is an optional SessionDriver method. Session calls Current before it
// hands out the live session, and ends the session (baton.ErrLeaseLost)
// when Current reports that the client has since lost it.
type SessionChecker[ID comparable] interface {
	Current(id ID) bool
}

// SessionGrant is a session a SessionDriver created.
type SessionGrant[ID comparable] struct {
	ID        ID
	SafeUntil time.Time // measured from the send time of the create
	// TTL is the session's TTL as the server granted it, named in errors.
	TTL time.Duration
	// Span is how far beyond its send time a confirmation puts
	// safe-until. While less than half of it is left, the SessionManager renews
	// the new session before anything rides on it, three times at most.
	Span time.Duration
	// Interval is the time between the session's renewals; zero means
	// SessionOptions.Config.RenewInterval. A SessionDriver sets it when the server it
	// reached allows a longer interval than the configured one (ZooKeeper's
	// standalone server, whose renewals ride on the client's own pings).
	Interval time.Duration
}

// SessionEndedError, returned by SessionDriver.Renew, ends the session with Err (which
// the session's terms report) and stops renewing it.
type SessionEndedError struct{ Err error }

// Error returns Err's message.
func (e *SessionEndedError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *SessionEndedError) Unwrap() error { return e.Err }

// SessionOptions configures a SessionManager.
type SessionOptions[ID comparable] struct {
	// Backend names the backend in errors: "etcd".
	Backend string
	// Config is the Backend's timing, defaults filled in: the session is
	// renewed every RenewInterval.
	Config Config
	// GrantTimeout bounds Grant and the renewals that follow it: the
	// clients wait for a connection rather than fail, and a campaign should
	// see baton.ErrBackendUnavailable instead.
	GrantTimeout time.Duration
	// AbandonFor is how long Revoke of an abandoned session is retried; by
	// then the server has dropped it anyway.
	AbandonFor time.Duration
	// Describe names session id in errors and logs: "etcd session 1f2e".
	Describe func(id ID) string
	// Lost says how the server drops sessions, after Describe's words in
	// the error of the terms it ended: "expired or was revoked on the
	// server".
	Lost string
	// Unavailable turns a failed request into a campaign's error. Nil means
	// ctx.Err() once ctx ended, and otherwise an error wrapping
	// baton.ErrBackendUnavailable.
	Unavailable func(ctx context.Context, what string, err error) error
	// Log receives the SessionManager's log lines; nil means silent.
	Log *slog.Logger
}

// Session is one server session and the terms riding on it.
type Session[ID comparable] struct {
	ID ID
	// interval is the time between renewals.
	interval time.Duration
	// keepUp is how far ahead safe-until stays while renewals keep up,
	// with room for a renewal's round trip: half of the span less an
	// interval. A campaign waits for a renewal when less is left.
	keepUp time.Duration
	// ctx is cancelled when the session ends, stopping everything that
	// works on its behalf.
	ctx    context.Context
	cancel context.CancelFunc

	*SessionTerms // safe-until and the live terms, extended by each renewal
}

// Context returns a context that is cancelled once the session ended and
// its terms with it.
func (s *Session[ID]) Context() context.Context { return s.ctx }

// Bound returns a context that ends with ctx or with the session.
func (s *Session[ID]) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	return c, func() { stop(); cancel() }
}

// SessionManager runs one Backend's sessions on a SessionDriver (see the package doc).
// Safe for concurrent use.
type SessionManager[ID comparable] struct {
	d   SessionDriver[ID]
	o   SessionOptions[ID]
	log *slog.Logger

	// ctx bounds the Backend's background work; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// granting admits one caller at a time to create the session, so that
	// a burst of first campaigns shares one; it is a channel so that
	// waiting honours the caller's ctx.
	granting chan struct{}

	mu     sync.Mutex
	closed bool
	sess   *Session[ID] // nil before the first campaign and after a session ended
	*slots              // guarded by mu
}

// NewSessionManager returns a SessionManager of sessions made by d.
func NewSessionManager[ID comparable](d SessionDriver[ID], o SessionOptions[ID]) *SessionManager[ID] {
	if o.Unavailable == nil {
		o.Unavailable = Unavailable
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &SessionManager[ID]{d: d, o: o, log: log, ctx: ctx, cancel: cancel, granting: make(chan struct{}, 1)}
	m.slots = newSlots(&m.mu, func() bool { return m.closed }, o.Backend)
	return m
}

// Unavailable is ctx.Err() once ctx ended (the caller gave up; err is
// noise), and otherwise err wrapped in baton.ErrBackendUnavailable.
func Unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %w", baton.ErrBackendUnavailable, what, err)
}

// Context returns the context of the Backend's background work, cancelled
// by Close.
func (m *SessionManager[ID]) Context() context.Context { return m.ctx }

// Closed reports whether Close was called.
func (m *SessionManager[ID]) Closed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// Go runs f in a goroutine that Close waits for, unless the SessionManager is
// closed, and reports whether it did.
func (m *SessionManager[ID]) Go(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Go(f)
	return true
}

// Live returns the live session, or nil if there is none.
func (m *SessionManager[ID]) Live() *Session[ID] {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sess
}

// Session returns the live session, granting one first if there is none.
// While the live session lags (its latest renewal failed, or less than
// half of its span less a renewal interval is left before safe-until, so
// a renewal is overdue), Session waits, within ctx, for the next confirmed
// renewal, or for the session's end and then grants a new one: a term
// started on a lagging session would be safe only until the last
// confirmed renewal's safe-until.
func (m *SessionManager[ID]) Session(ctx context.Context) (*Session[ID], error) {
	select {
	case m.granting <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-m.granting }()
	for {
		m.mu.Lock()
		closed, s := m.closed, m.sess
		m.mu.Unlock()
		if closed {
			return nil, baton.ErrClosed
		}
		if s == nil || s.ctx.Err() != nil {
			break
		}
		if c, ok := m.d.(SessionChecker[ID]); ok && !c.Current(s.ID) {
			m.Lost(s) // the client lost it before a renewal noticed
			break
		}
		lag := s.Lagging(s.keepUp)
		if lag == nil {
			return s, nil
		}
		// Its latest renewal failed, or is overdue: a term won on it now
		// would be born with the safe-until of the last confirmed
		// renewal, perhaps too close for the holder to start work, and a
		// holder that resigns such a term at once would win it again,
		// and again, each time taking a token. Wait for the next
		// confirmed renewal, or for the session's end at its safe-until
		// and then a new session.
		m.log.Debug("campaign waits for the lagging session's next renewal", "session", m.o.Describe(s.ID))
		select {
		case <-lag:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	g, err := m.grant(ctx)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(m.ctx)
	interval := g.Interval
	if interval <= 0 {
		interval = m.o.Config.RenewInterval
	}
	s := &Session[ID]{ID: g.ID, interval: interval, keepUp: (g.Span - interval) / 2, ctx: sctx, cancel: cancel, SessionTerms: NewSessionTerms(g.SafeUntil)}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		cancel()
		rctx, rcancel := context.WithTimeout(context.Background(), m.o.Config.RenewInterval)
		_ = m.d.Revoke(rctx, g.ID, false) // else it expires unused after its TTL
		rcancel()
		return nil, baton.ErrClosed
	}
	m.sess = s
	m.wg.Go(func() { m.keepAlive(s) })
	m.mu.Unlock()
	m.log.Debug("session granted", "session", m.o.Describe(g.ID), "ttl", g.TTL)
	return s, nil
}

// grant creates a session with at least half its span left.
func (m *SessionManager[ID]) grant(ctx context.Context) (SessionGrant[ID], error) {
	gctx, cancel := context.WithTimeout(ctx, m.o.GrantTimeout)
	defer cancel()
	sent := time.Now()
	g, err := m.d.Grant(gctx)
	g.SafeUntil = m.o.Config.CapSafeUntil(sent, g.SafeUntil)
	if m.o.Config.TTL > 0 {
		g.Span = min(g.Span, m.o.Config.TTL-m.o.Config.DriftMargin)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return g, ctx.Err()
	case errors.Is(err, baton.ErrBackendUnavailable), errors.Is(err, baton.ErrClosed), errors.As(err, new(*baton.ConfigError)):
		// A *baton.ConfigError is a setting the server refuses for good
		// (a TTL beyond its limits): the Elector stops on it rather than
		// retrying it as an outage.
		return g, err
	default:
		return g, m.o.Unavailable(ctx, "create session", err)
	}
	// A grant sent while the client was reconnecting may return with its
	// safe-until all but spent. Nothing rides on the session yet, so a
	// renewal now gives it a full term, measured from this send.
	for tries := 0; time.Until(g.SafeUntil) < g.Span/2; tries++ {
		if tries == 3 {
			m.abandon(g.ID)
			return g, fmt.Errorf("%w: %s confirms session renewals too slowly for a TTL of %s", baton.ErrBackendUnavailable, m.o.Backend, g.TTL)
		}
		if g.SafeUntil, err = m.renew(gctx, g.ID); err != nil {
			m.abandon(g.ID)
			return g, m.o.Unavailable(ctx, "renew new session", err)
		}
	}
	return g, nil
}

// renew renews session id once through the SessionDriver, and returns the new
// safe-until, never later than this call's start + TTL - DriftMargin: a
// driver that believed a server's reply about time (a TTL longer than
// asked, from a misconfigured server or an impostor) cannot stretch a term
// past what the client's own clock and TTL allow.
func (m *SessionManager[ID]) renew(ctx context.Context, id ID) (time.Time, error) {
	sent := time.Now()
	until, err := m.d.Renew(ctx, id)
	if err != nil {
		return until, err
	}
	return m.o.Config.CapSafeUntil(sent, until), nil
}

// keepAlive renews s every interval until it ends.
func (m *SessionManager[ID]) keepAlive(s *Session[ID]) {
	s.keepAlive(s.ctx, renewal{
		Interval: s.interval,
		Renew:    func(ctx context.Context) (time.Time, error) { return m.renew(ctx, s.ID) },
		Gone: func(err error) bool {
			var e *SessionEndedError
			return errors.As(err, &e) || m.d.Gone(err)
		},
		Expired: func(lastErr error) { m.expire(s, lastErr) },
		Lost: func(err error) {
			if e := (*SessionEndedError)(nil); errors.As(err, &e) {
				m.End(s, e.Err)
				return
			}
			m.Lost(s)
		},
		Failed: func(err error, left time.Duration) {
			m.log.Warn("session renewal failed; retrying", "session", m.o.Describe(s.ID), "err", err,
				"safe_until_in", left.Round(time.Millisecond))
		},
	})
}

// Lost ends s with baton.ErrLeaseLost: the server no longer has it.
func (m *SessionManager[ID]) Lost(s *Session[ID]) {
	m.log.Warn("the server dropped the session", "session", m.o.Describe(s.ID), "how", m.o.Lost)
	m.End(s, fmt.Errorf("%w: %s %s", baton.ErrLeaseLost, m.o.Describe(s.ID), m.o.Lost))
}

// expire ends s at its safe-until and revokes it in the background. The
// session may still be alive on the server, holding our keys: renewing it
// again could not revive the terms, so it is dropped rather than left to
// block other candidates until the server drops it.
func (m *SessionManager[ID]) expire(s *Session[ID], lastErr error) {
	err := fmt.Errorf("%w: %s not renewed in time", baton.ErrExpired, m.o.Describe(s.ID))
	if lastErr != nil {
		err = fmt.Errorf("%w: %s not renewed in time (last renewal error: %w)", baton.ErrExpired, m.o.Describe(s.ID), lastErr)
	}
	m.log.Warn("session expired before a renewal was confirmed; starting afresh", "session", m.o.Describe(s.ID), "err", lastErr)
	m.End(s, err)
	m.abandon(s.ID)
}

// abandon revokes session id in the background (see SessionDriver.Revoke).
func (m *SessionManager[ID]) abandon(id ID) {
	m.Go(func() {
		ctx, cancel := context.WithTimeout(m.ctx, m.o.AbandonFor)
		defer cancel()
		for {
			err := m.d.Revoke(ctx, id, true)
			if err == nil || m.d.Gone(err) {
				return
			}
			m.log.Debug("revoking an abandoned session failed; retrying", "session", m.o.Describe(id), "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.o.Config.RenewInterval / 4):
			}
		}
	})
}

// End ends s and its terms with err. NewSessionManager campaigns get a new session.
func (m *SessionManager[ID]) End(s *Session[ID], err error) {
	m.mu.Lock()
	if m.sess == s {
		m.sess = nil
	}
	m.mu.Unlock()
	// End the terms before cancelling s.ctx, which lets their watchers
	// give up the lease names: a name must not be free while its term
	// lasts.
	s.End(err)
	s.cancel()
}

// CampaignErr turns err, met while campaigning for lease on s, into
// Campaign's error: ctx.Err() once ctx ended (the caller gave up; the cause
// is noise), baton.ErrClosed once the SessionManager is closed, and otherwise an
// error wrapping baton.ErrBackendUnavailable, with why the session ended in
// place of err when it did.
func (m *SessionManager[ID]) CampaignErr(ctx context.Context, s *Session[ID], lease, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if m.Closed() {
		return baton.ErrClosed
	}
	if serr := s.Err(); serr != nil {
		err = serr
	}
	return fmt.Errorf("%w: lease %q: %s: %w", baton.ErrBackendUnavailable, lease, what, err)
}

// StartOptions says what SessionManager.Start does besides starting the
// term.
type StartOptions struct {
	// UntilGone makes a new claim for the name wait, once the term ended,
	// until Gone says that what the term held is gone.
	UntilGone bool
	// Started, if not nil, runs with the SessionManager's mutex held once the
	// term started: for registering the term where Close finds it. It must
	// not block or call the SessionManager.
	Started func(t *BasicTerm)
	// Watch, if not nil, runs in a goroutine that Close waits for: it
	// watches the held key or node, and ends the term when it goes. A
	// backend that watches all its held keys at once (one watch per
	// session) leaves it nil, and needs no goroutine per term.
	Watch func()
	// Cap, if not zero, is a deadline the term's safe-until does not pass
	// until SessionTerms.Uncap (see SessionTerms.StartCapped).
	Cap time.Time
}

// Start begins the term of lease with token that sl's campaign won on s,
// atomically with respect to Close and to s ending: either they see the
// term and end it, or Start sees them and starts nothing, returning
// baton.ErrClosed or an error wrapping baton.ErrBackendUnavailable.
// release is the term's release function (see NewBasicTerm).
func (m *SessionManager[ID]) Start(s *Session[ID], sl *Slot, lease string, token uint64, release func(context.Context) error, w StartOptions) (*BasicTerm, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, baton.ErrClosed
	}
	var t *BasicTerm
	var ok bool
	if w.Cap.IsZero() {
		t, ok = s.Start(lease, token, release)
	} else {
		t, ok = s.StartCapped(lease, token, release, w.Cap)
	}
	if !ok {
		return nil, fmt.Errorf("%w: lease %q: %s ended, or reached its safe-until, as the lease was won",
			baton.ErrBackendUnavailable, lease, m.o.Describe(s.ID))
	}
	if w.UntilGone {
		m.wonUntilGoneLocked(sl, t)
	} else {
		m.wonLocked(sl, t)
	}
	if w.Started != nil {
		w.Started(t)
	}
	if w.Watch != nil {
		m.wg.Go(w.Watch)
	}
	return t, nil
}

// Term returns the term won for lease name, or nil.
func (m *SessionManager[ID]) Term(name string) *BasicTerm {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.termLocked(name)
}

// CleanLater runs clean, which deletes what a campaign or a term of sl
// left behind, in a goroutine that Close waits for, unless the SessionManager is
// closed (then Close deletes it, or revokes the session that holds it).
// While clean runs, sl (if not nil and still its name's slot) keeps the
// name claimed, so that no new campaign's key or node can be mistaken for
// the old one.
func (m *SessionManager[ID]) CleanLater(sl *Slot, clean func()) {
	m.cleanLater(sl, false, clean)
}

// CleanClaimed is CleanLater for a clean-up that is right only while sl
// holds its name, as when what it deletes is told apart by the session
// alone: it does nothing when sl no longer holds the name, or a clean-up
// after sl's campaign is already marked.
func (m *SessionManager[ID]) CleanClaimed(sl *Slot, clean func()) {
	m.cleanLater(sl, true, clean)
}

func (m *SessionManager[ID]) cleanLater(sl *Slot, claimed bool, clean func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	done := func() {}
	if sl != nil {
		var ok bool
		if done, ok = m.cleaningLocked(sl); !ok && claimed {
			return
		}
	}
	m.wg.Go(func() {
		defer done()
		clean()
	})
}

// Retry calls try every interval, with a context bounded by timeout, until
// it returns nil (Retry then reports true) or ctx ends (false). The first
// try is at once if now is true, and after an interval otherwise.
func Retry(ctx context.Context, interval, timeout time.Duration, now bool, try func(context.Context) error) bool {
	for first := true; ; first = false {
		if !first || !now {
			select {
			case <-ctx.Done():
				return false
			case <-time.After(interval):
			}
		}
		tctx, cancel := context.WithTimeout(ctx, timeout)
		err := try(tctx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
	}
}

// Close marks the SessionManager closed, so that Session, Claim, Start, Go and
// CleanLater refuse from now on, and takes the live session down, if
// there is one: it ends its terms (their Err wraps baton.ErrClosed), runs
// letGo, cancels the session's context and revokes it within ctx. It then
// cancels the background context and waits for every goroutine the
// SessionManager started. letGo (if not nil) runs whether or not there was a
// session (s is nil then): what the backend must do on the server before
// the session goes. Close returns letGo's and the revoke's errors. A
// second Close waits for the goroutines and returns nil.
func (m *SessionManager[ID]) Close(ctx context.Context, letGo func(s *Session[ID]) error) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.wg.Wait()
		return nil
	}
	m.closed = true
	s := m.sess
	m.sess = nil
	m.mu.Unlock()
	var errs []error
	if s != nil {
		s.End(fmt.Errorf("%w: %s closed", baton.ErrClosed, m.o.Describe(s.ID)))
	}
	if letGo != nil {
		if err := letGo(s); err != nil {
			errs = append(errs, err)
		}
	}
	if s != nil {
		s.cancel()
		if err := m.d.Revoke(ctx, s.ID, false); err != nil && !m.d.Gone(err) {
			errs = append(errs, err)
		}
	}
	m.cancel()
	m.wg.Wait()
	return errors.Join(errs...)
}
