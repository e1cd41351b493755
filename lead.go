package baton

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults of the zero values of Backoff, LeadConfig and ElectorConfig, and
// so of everything that runs terms with them (balance.Group,
// gocronbaton.Locker, `baton run`).
const (
	// DefaultRetryMin is the first wait of a Backoff whose Min is zero.
	DefaultRetryMin = 100 * time.Millisecond
	// DefaultRetryMax is the longest wait of a Backoff whose Max is zero.
	DefaultRetryMax = 10 * time.Second
	// DefaultResignTimeout bounds the release of a lease when
	// LeadConfig.ResignTimeout is zero.
	DefaultResignTimeout = 5 * time.Second
)

// Backoff is the exponential back-off, with jitter, between campaigns that
// failed. Its zero value waits from DefaultRetryMin up to DefaultRetryMax.
// It is not safe for concurrent use: give each campaign loop its own.
type Backoff struct {
	// Min is the longest first wait; zero means DefaultRetryMin.
	Min time.Duration
	// Max caps the waits; zero means DefaultRetryMax. A Max below Min
	// counts as Min.
	Max time.Duration

	cur time.Duration // 0: start again at Min
}

// Next returns how long to wait before the next attempt, a random duration
// in [d/2, d], where d is Min at first and doubles with each call, up to
// Max. The jitter keeps instances that failed together from retrying
// together.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = DefaultRetryMin
	}
	if hi <= 0 {
		hi = DefaultRetryMax
	}
	hi = max(hi, lo)
	if b.cur == 0 {
		b.cur = lo
	}
	d := min(b.cur, hi)
	b.cur = min(2*d, hi)
	return d/2 + rand.N(d/2+1)
}

// Reset starts the waits again at Min, after an attempt that worked.
func (b *Backoff) Reset() { b.cur = 0 }

// Campaign campaigns for lease on b as c until it wins, retrying with
// back-off (bo) the failures that a retry may fix, and returns the term.
// It returns ctx's error once ctx has ended, and at once, without a retry,
// an error that no retry fixes: one wrapping ErrClosed (the backend was
// closed) or matching *ConfigError (a configuration the backend refuses,
// such as a TTL below Consul's session_ttl_min).
//
// A nil bo counts as a zero Backoff of this call's own.
//
// Before each wait Campaign calls failed, when not nil, with the error and
// the wait, to log it or to record it. When failed returns false, Campaign
// returns the error after the wait instead of trying again, so that two
// campaigns of a caller that campaigns on demand are still a back-off
// apart. Campaign does not reset bo: call bo.Reset once the term it won
// went well.
func Campaign(ctx context.Context, b Backend, lease string, c Candidate, bo *Backoff,
	failed func(err error, wait time.Duration) (retry bool)) (Term, error) {
	if bo == nil {
		bo = new(Backoff)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := b.Campaign(ctx, lease, c)
		if err == nil {
			return t, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ce *ConfigError
		if errors.Is(err, ErrClosed) || errors.As(err, &ce) {
			return nil, err
		}
		wait := bo.Next()
		retry := failed == nil || failed(err, wait)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-timer.C:
		}
		if !retry {
			return nil, err
		}
	}
}

// LeadConfig says how Lead runs work under a term. The zero value of each
// field means the documented default.
type LeadConfig struct {
	// StopEarly ends the work's context this long before the term's
	// safe-until when renewals lag, instead of at safe-until, so that work
	// which needs time to wind down is over before another candidate can
	// take over. It must be below the backend's renewal window
	// (RenewalWindower), or every term stops as soon as it begins. Zero,
	// or a negative value, means at safe-until.
	StopEarly time.Duration

	// ResignTimeout bounds the release of the lease after the work
	// returned. Zero means DefaultResignTimeout (5 s). A release that
	// fails or times out is logged; the lease then expires after its TTL.
	ResignTimeout time.Duration

	// Logger receives Lead's warnings (renewals lag, a resign requested, a
	// release that failed), with the term's token. Give it the lease's
	// attributes. Nil means silent.
	Logger *slog.Logger
}

// Lead runs fn for one term t and then releases the lease: the step that
// Elector.Run repeats after each campaign, for a program that holds Terms
// itself (from Campaign, or Backend.Campaign).
//
// fn gets a context derived from ctx that is cancelled, with a cause that
// says why (context.Cause), when:
//   - t ends: the cause is t.Err() (ErrLeaseLost, ErrExpired, ...);
//   - StopEarly before t's safe-until passes with no renewal confirmed:
//     an error wrapping ErrStoppedEarly (the term still holds the lease
//     until safe-until, so the work has StopEarly left to stop);
//   - a resign of t is requested from outside (ResignRequestTerm): an error
//     wrapping ErrResigned that says so;
//   - ctx ends: ctx's cause.
//
// Lead enforces the safe-until deadline itself too, for a Term that does
// not end by itself at it. It waits for fn to return, then resigns t
// within ResignTimeout, so a waiting candidate takes over at once but only
// after fn's work has stopped. It returns fn's error.
//
// When no more than StopEarly is left before t's safe-until as Lead begins
// (a lagging session won), Lead does not call fn: work that could not be
// stopped in time is not started. It resigns t and returns nil. A loop
// that then campaigns again should wait bo.Next() first, and not reset
// bo, as Elector.Run does: at once, it could win the lease as short again,
// once per round trip, each time taking a fencing token.
//
// Lead is safe for concurrent use on different terms.
func Lead(ctx context.Context, t Term, cfg LeadConfig, fn func(ctx context.Context, t Term) error) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("token", t.Token())
	// The work never runs past safe-until, whatever StopEarly says.
	cfg.StopEarly = max(cfg.StopEarly, 0)
	if left := time.Until(t.SafeUntil()); left <= cfg.StopEarly {
		log.Warn("elected with too little time before safe-until; resigning", "left", left, "stop_early", cfg.StopEarly)
		resign(ctx, t, cfg.ResignTimeout, log)
		return nil
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := watchTerm(t, cfg.StopEarly, cancel, func(left time.Duration) {
		log.Warn("renewals lag: stopping before safe-until", "safe_until_in", left)
	})
	stopReq := watchResignRequest(t, func() {
		log.Info("resign requested: stopping the work before releasing the lease")
		cancel(errResignRequested)
	})
	ferr := fn(fctx, t)
	stopReq()
	stop()
	cancel(nil)
	if !time.Now().Before(t.SafeUntil()) {
		// Past safe-until the term is over whether or not it has said so:
		// let it end with its own reason (ErrExpired, ErrLeaseLost), which
		// the backend gives at safe-until, rather than ErrResigned.
		awaitEnd(t, cfg.ResignTimeout)
	}
	resign(ctx, t, cfg.ResignTimeout, log)
	return ferr
}

// awaitEnd waits until t has ended, for at most timeout (zero:
// DefaultResignTimeout).
func awaitEnd(t Term, timeout time.Duration) {
	if timeout <= 0 {
		timeout = DefaultResignTimeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-t.Done():
	case <-timer.C:
	}
}

// resign releases t within timeout (zero: DefaultResignTimeout), also when
// ctx has ended: the release is what lets a standby take over at once.
func resign(ctx context.Context, t Term, timeout time.Duration, log *slog.Logger) {
	if timeout <= 0 {
		timeout = DefaultResignTimeout
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := t.Resign(rctx); err != nil {
		log.Warn("releasing the lease failed; it will expire after its TTL", "err", err)
	}
}

// errResignRequested is the cause of the work's context when the backend
// relayed a request that the holder resign (ResignRequestTerm).
var errResignRequested = fmt.Errorf("%w: a resign was requested: stopping the work, then releasing the lease", ErrResigned)

// watchTerm calls cancel with t.Err() when t ends, or, once safe-until
// minus early has passed (renewals lag: safe-until stopped moving), with
// an error wrapping ErrStoppedEarly that says how far safe-until is;
// lagged is called first with that distance, to log it. A term from a
// third-party backend might not end itself at its safe-until, and early
// wants the work out sooner, so the deadline is enforced here too. The
// returned stop ends the watch, and returns once it has ended: after stop,
// cancel is not called.
func watchTerm(t Term, early time.Duration, cancel context.CancelCauseFunc, lagged func(left time.Duration)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		deadline := func() time.Time { return t.SafeUntil().Add(-early) }
		timer := time.NewTimer(time.Until(deadline()))
		defer timer.Stop()
		for {
			select {
			case <-t.Done():
				cancel(t.Err())
				return
			case <-done:
				return
			case <-timer.C:
				if left := time.Until(deadline()); left > 0 {
					timer.Reset(left)
					continue
				}
				left := time.Until(t.SafeUntil())
				lagged(left)
				cancel(fmt.Errorf("%w: no renewal confirmed, and safe-until is %s away, within StopEarly (%s)",
					ErrStoppedEarly, left.Round(time.Millisecond), early))
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// watchResignRequest calls requested when a resign of t is requested from
// outside (ResignRequestTerm), unless t ends first; never for a Term that
// cannot relay requests. The work stops while t goes on; the caller
// resigns once the work has returned. The returned stop ends the watch, and
// returns once it has ended: after stop, requested is not called.
func watchResignRequest(t Term, requested func()) (stop func()) {
	req := ResignRequestedOf(t)
	if req == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-req:
			requested()
		case <-t.Done():
		case <-done:
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
