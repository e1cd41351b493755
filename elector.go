package baton

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ElectorConfig configures an Elector. The zero value of each field means the
// documented default; Lease is the only required field.
type ElectorConfig struct {
	// Lease is the name of the lease to campaign for. Required.
	Lease string

	// Candidate is who campaigns. An empty ID means NewCandidateID().
	Candidate Candidate

	// Logger receives the Elector's log lines (group "baton"). Nil means silent.
	Logger *slog.Logger

	// RetryMin and RetryMax bound the exponential back-off (with jitter) between
	// campaigns that failed because the backend was unavailable, or that won
	// a term with no more than StopEarly left: they are Backoff's Min and
	// Max. Zero means DefaultRetryMin (100 ms) and DefaultRetryMax (10 s).
	RetryMin, RetryMax time.Duration

	// StopEarly makes the callback's context end this long before the
	// term's safe-until deadline when renewals lag, instead of at the deadline,
	// so that work which needs time to wind down (a child process given a grace
	// period before SIGKILL) is over before another candidate can take over.
	// In healthy operation safe-until stays at least TTL − RenewInterval −
	// DriftMargin ahead, so StopEarly must be below that or every term ends at
	// once. Zero (the default) means at safe-until. The context's cause then
	// wraps ErrStoppedEarly.
	StopEarly time.Duration

	// ResignTimeout bounds the release of the lease after the callback returned.
	// Zero means DefaultResignTimeout (5 s). A release that times out is
	// logged; the lease then expires after its TTL.
	ResignTimeout time.Duration

	// OnElected, if set, is called with each new term as it starts, before
	// Run's callback gets it, on Run's goroutine: the callback waits for it,
	// so keep it short (update a metric, flip a readiness flag).
	OnElected func(t Term)

	// OnDemoted, if set, is called when a term has ended and the lease was
	// released (or its release failed), after Run's callback returned, with
	// why the term ended: an error wrapping ErrResigned (the callback
	// returned, renewals lagged past StopEarly, or a resign was requested),
	// ErrLeaseLost, ErrExpired
	// or ErrClosed. It runs on Run's goroutine, as OnElected does.
	//
	// OnElected and OnDemoted see every transition, in order, and none is
	// dropped: they are the way to follow transitions (a metric, a log, a
	// readiness flag). Status and Await read the current state.
	OnDemoted func(t Term, reason error)
}

// Status is a snapshot of an Elector's state.
type Status struct {
	// Lease is the lease name and ID the candidate's ID.
	Lease, ID string
	// Leader reports whether this Elector holds the lease and is before its
	// safe-until deadline (less StopEarly).
	Leader bool
	// Term is the current term while Leader is true, nil otherwise.
	Term Term
	// Token is the fencing token of the current term, or of the last one.
	Token uint64
	// HighestToken is the highest token of the terms this Elector has
	// held. It is above Token only when the backend's tokens went
	// backwards (it lost its data and the epoch folded into tokens did not
	// cover it, see docs/guarantees.md): the Elector then logs an error, as
	// downstream stores that fence on tokens will refuse this leader.
	HighestToken uint64
	// SafeUntil is the current term's deadline; zero when not leading.
	SafeUntil time.Time
	// Since is when the current state (leading or not) began.
	Since time.Time
	// Terms counts the terms this Elector has held.
	Terms int
	// LastError is the most recent campaign error or term-ending reason.
	LastError error
}

// Elector campaigns for one lease on a Backend and runs a callback while it
// leads. Create it with NewElector. Its methods are safe for concurrent use;
// Run may be active at most once at a time.
type Elector struct {
	b   Backend
	cfg ElectorConfig
	log *slog.Logger

	running atomic.Bool
	term    atomic.Pointer[termBox]

	mu      sync.Mutex
	status  Status
	changed chan struct{} // closed and replaced on each transition, for Await
}

type termBox struct{ t Term }

// NewElector returns an Elector campaigning for cfg.Lease on b.
func NewElector(b Backend, cfg ElectorConfig) (*Elector, error) {
	var errs ConfigError
	if b == nil {
		errs.add("Backend is nil: pass a backend such as memory.New(...) or etcd.New(...)")
	}
	if cfg.Lease == "" {
		errs.add("Lease is empty: name the lease to campaign for")
	}
	if cfg.RetryMin < 0 || cfg.RetryMax < 0 || cfg.ResignTimeout < 0 || cfg.StopEarly < 0 {
		errs.add(fmt.Sprintf("RetryMin (%s), RetryMax (%s), ResignTimeout (%s) and StopEarly (%s) must not be negative",
			cfg.RetryMin, cfg.RetryMax, cfg.ResignTimeout, cfg.StopEarly))
	}
	if w, ok := b.(RenewalWindower); ok && cfg.StopEarly > 0 && cfg.StopEarly >= w.RenewalWindow() {
		errs.add(fmt.Sprintf("StopEarly (%s) must be below the backend's renewal window (%s): how far ahead safe-until stays while renewals are healthy; otherwise every term stops as soon as it begins",
			cfg.StopEarly, w.RenewalWindow()))
	}
	if err := errs.errOrNil(); err != nil {
		return nil, err
	}
	if cfg.Candidate.ID == "" {
		cfg.Candidate.ID = NewCandidateID()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Elector{
		b:       b,
		cfg:     cfg,
		log:     log.WithGroup("baton").With("lease", cfg.Lease, "id", cfg.Candidate.ID),
		changed: make(chan struct{}),
	}
	e.status = Status{Lease: cfg.Lease, ID: cfg.Candidate.ID, Since: time.Now()}
	return e, nil
}

// ID returns the candidate ID the Elector campaigns with.
func (e *Elector) ID() string { return e.cfg.Candidate.ID }

// Run campaigns until ctx ends. Each time it wins, it calls fn with a context
// that is cancelled when the term ends for any reason — lost, expired at
// safe-until, renewals lagging into StopEarly, a resign requested from
// outside (ResignRequestTerm), or ctx cancelled — and with the Term.
// context.Cause of fn's context says which: the term's error, an error
// wrapping ErrStoppedEarly (renewals lag), an error wrapping ErrResigned
// that says a resign was requested, or ctx's own cause. balance.Group gives
// its Funcs the same causes. When fn returns, Run resigns (so
// a standby takes over at once) and campaigns again. Run always waits for fn
// to return before it resigns, so that a requested resign, like a stopped
// Run, hands the lease over only after fn's work has stopped. A term won
// with no more than StopEarly left before its safe-until is resigned
// without calling fn (see Lead), and Run campaigns again after the same
// back-off as after a failed campaign, not at once.
//
// Run returns when ctx ends (with ctx's error), or when fn returns a non-nil
// error (with that error, after resigning), or when the backend is closed
// (with an error wrapping ErrClosed), or when Campaign fails with an error
// matching *ConfigError (a configuration the backend refuses, which no
// retry fixes). Other campaign failures are retried with back-off and
// logged, never returned.
func (e *Elector) Run(ctx context.Context, fn func(ctx context.Context, t Term) error) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("baton: Elector.Run is already running; use one Elector per Run")
	}
	defer e.running.Store(false)

	bo := Backoff{Min: e.cfg.RetryMin, Max: e.cfg.RetryMax}
	lc := LeadConfig{StopEarly: e.cfg.StopEarly, ResignTimeout: e.cfg.ResignTimeout, Logger: e.log}
	for {
		t, err := Campaign(ctx, e.b, e.cfg.Lease, e.cfg.Candidate, &bo, func(err error, wait time.Duration) bool {
			e.setError(err)
			e.log.Warn("campaign failed; retrying", "err", err, "retry_in", wait)
			return true
		})
		if err != nil {
			return err
		}
		led := false
		ferr := Lead(ctx, t, lc, func(ctx context.Context, t Term) error {
			led = true
			e.elected(t)
			return fn(ctx, t)
		})
		if led {
			e.demoted(t, t.Err())
		}
		if ferr != nil {
			return ferr
		}
		if led {
			bo.Reset()
			continue
		}
		// Lead resigned a term born too close to its safe-until: the
		// backend's renewals lag. Campaigning again at once would win
		// the same lease, as short, once per round trip, each time
		// taking a fencing token; back off as after a failed campaign.
		timer := time.NewTimer(bo.Next())
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// isLeader reports whether the Elector holds its lease now and is before
// the term's safe-until deadline (less StopEarly), and that term.
func (e *Elector) isLeader() (Term, bool) {
	b := e.term.Load()
	if b == nil {
		return nil, false
	}
	select {
	case <-b.t.Done():
		return nil, false
	default:
	}
	if !time.Now().Before(b.t.SafeUntil().Add(-e.cfg.StopEarly)) {
		return nil, false
	}
	return b.t, true
}

// Leader asks the backend who holds the lease.
func (e *Elector) Leader(ctx context.Context) (Record, error) {
	return e.b.Leader(ctx, e.cfg.Lease)
}

// Await blocks until the Elector leads (while Run is active elsewhere) and
// returns the term, or returns ctx's error. Like Curator's LeaderLatch.await.
// It returns at once when the Elector leads already.
func (e *Elector) Await(ctx context.Context) (Term, error) {
	for {
		e.mu.Lock()
		ch := e.changed
		e.mu.Unlock()
		if t, ok := e.isLeader(); ok {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

// Status returns a snapshot of the Elector's state. It does not contact
// the backend, and is cheap enough for every request of a health check.
func (e *Elector) Status() Status {
	e.mu.Lock()
	s := e.status
	e.mu.Unlock()
	if t, ok := e.isLeader(); ok {
		s.Leader, s.Term, s.SafeUntil = true, t, t.SafeUntil()
	}
	return s
}

func (e *Elector) elected(t Term) {
	e.term.Store(&termBox{t})
	now := time.Now()
	e.log.Info("elected", electedAttrs(t)...)
	e.mu.Lock()
	if e.status.Terms > 0 && t.Token() <= e.status.HighestToken {
		e.log.Error("fencing token did not increase: the backend lost its data or was replaced, and stores that fence on tokens will refuse this leader's writes",
			"token", t.Token(), "highest_token", e.status.HighestToken)
	}
	e.status.HighestToken = max(e.status.HighestToken, t.Token())
	e.status.Token = t.Token()
	e.status.Since = now
	e.status.Terms++
	e.notifyLocked()
	e.mu.Unlock()
	if e.cfg.OnElected != nil {
		e.cfg.OnElected(t)
	}
}

// electedAttrs are the attributes of the "elected" line: the token, and
// the previous holder and how its term ended when the backend knows
// (PredecessorTerm).
func electedAttrs(t Term) []any {
	attrs := []any{"token", t.Token()}
	pt, ok := t.(PredecessorTerm)
	if !ok {
		return attrs
	}
	p, ok := pt.Predecessor()
	switch {
	case !ok:
	case p.First:
		attrs = append(attrs, "previous", "none: the first term of this lease")
	default:
		attrs = append(attrs, "previous", p.Holder)
		if p.Via != "" {
			attrs = append(attrs, "previous_via", p.Via)
		}
		attrs = append(attrs, "previous_token", p.Token, "previous_ended", p.Ended)
	}
	return attrs
}

func (e *Elector) demoted(t Term, reason error) {
	e.term.Store(nil)
	now := time.Now()
	e.log.Info("term ended", "token", t.Token(), "reason", reason)
	e.mu.Lock()
	e.status.Since = now
	e.status.LastError = reason
	e.notifyLocked()
	e.mu.Unlock()
	if e.cfg.OnDemoted != nil {
		e.cfg.OnDemoted(t, reason)
	}
}

func (e *Elector) setError(err error) {
	e.mu.Lock()
	e.status.LastError = err
	e.mu.Unlock()
}

// notifyLocked wakes the Awaits waiting for a transition.
func (e *Elector) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}
