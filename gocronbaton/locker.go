package gocronbaton

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/go-co-op/gocron/v2"
)

// Defaults applied to zero LockerOptions fields.
const (
	// DefaultWait is LockerOptions.Wait's default.
	DefaultWait = 500 * time.Millisecond
	// DefaultHold is LockerOptions.Hold's default.
	DefaultHold = time.Second
)

// LockerOptions configures a Locker. The zero value of each field means the
// documented default.
type LockerOptions struct {
	// Candidate is who campaigns. An empty ID means baton.NewCandidateID().
	Candidate baton.Candidate

	// Prefix goes in front of every lease name. The lease of a job is Prefix
	// plus the job's gocron name (its key) with url.PathEscape applied, so
	// that a name such as "github.com/acme/app.report" contains no "/",
	// which etcd and ZooKeeper reject. Default "".
	Prefix string

	// LeaseName, when set, maps a key to its lease name instead of Prefix and
	// escaping.
	LeaseName func(key string) string

	// Wait bounds how long Lock waits for a free lease that another instance
	// may be winning at the same moment. When the backend reports the lease
	// held by another instance, Lock fails at once instead. It must be below
	// Hold: a Lock that waited longer could win the lease after the winner of
	// the same run released it, and run the job a second time. Zero means
	// DefaultWait (500 ms) or Hold/2, whichever is shorter.
	Wait time.Duration

	// Hold is the least time a lock stays held after Lock acquired it, even
	// when the job finishes sooner: the other schedulers' attempts at the same
	// run fire up to their clock difference later and must find it taken.
	// Keep it above that difference. Below the job's interval, runs spread
	// over the instances; at or above it, the instance holding the lock keeps
	// it for as long as it keeps running the job (its next Lock reuses the
	// held lease). Zero means DefaultHold (1 s).
	Hold time.Duration

	// MinRemaining makes Lock refuse a term with less than this left before
	// its safe-until deadline. Zero (the default) means any time left.
	MinRemaining time.Duration

	// ResignTimeout bounds each release of a lease. Zero means
	// baton.DefaultResignTimeout (5 s).
	ResignTimeout time.Duration

	// Logger receives the Locker's log lines (group "gocronbaton"). Nil means
	// silent.
	Logger *slog.Logger
}

// Locker implements gocron.Locker with one baton lease per job. Create it with
// NewLocker and Close it after the scheduler has shut down. Safe for
// concurrent use.
//
// For each key it has been asked for, a Locker keeps one goroutine that
// campaigns when a Lock wants the lease, holds it while a run uses it (and
// for Hold), and releases it. After a Lock failed because another instance
// holds the lease, that goroutine stays in the campaign as a standby, so that
// a holder that died is noticed: on record-store backends a lease is only
// taken over by a candidate that watched it unrenewed for a full TTL. A
// standby that wins with no run waiting releases the lease at once, leaving
// it free for the next Lock.
type Locker struct {
	b    baton.Backend
	opts LockerOptions
	log  *slog.Logger

	ctx    context.Context // ends at Close: campaigns stop, leases are released
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	keys   map[string]*keyState
}

var _ gocron.Locker = (*Locker)(nil)

// keyState is the lease of one key. Guarded by Locker.mu, except kick.
type keyState struct {
	key, lease string
	want       bool  // campaign: a Lock is waiting, or one failed (stand by)
	waiters    int   // Locks waiting for the campaign now
	fails      int   // campaign failures so far
	lastErr    error // the latest campaign failure
	err        error // set when the key's goroutine stopped for good
	term       baton.Term
	unclaimed  bool      // term was won and no run has claimed it yet
	user       *lock     // the run holding term, nil when idle
	until      time.Time // do not release before
	changed    chan struct{}
	kick       chan struct{} // capacity 1: wakes the key's goroutine
}

// lock is one run's hold on a key's lease.
type lock struct {
	l  *Locker
	ks *keyState
	t  baton.Term
}

// NewLocker returns a Locker campaigning on b. The Backend is the caller's:
// the Locker never closes it.
func NewLocker(b baton.Backend, opts LockerOptions) (*Locker, error) {
	var problems []string
	if b == nil {
		problems = append(problems, "gocronbaton: Backend is nil: pass a backend such as memory.New(...) or etcd.New(...)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Wait", opts.Wait}, {"Hold", opts.Hold}, {"MinRemaining", opts.MinRemaining}, {"ResignTimeout", opts.ResignTimeout}} {
		if d.v < 0 {
			problems = append(problems, fmt.Sprintf("gocronbaton: %s (%s) must not be negative: zero means the default", d.name, d.v))
		}
	}
	if opts.Hold == 0 {
		opts.Hold = DefaultHold
	}
	if opts.Wait == 0 {
		opts.Wait = min(DefaultWait, opts.Hold/2)
	}
	if opts.Wait >= opts.Hold {
		problems = append(problems, fmt.Sprintf("gocronbaton: Wait (%s) must be below Hold (%s): a Lock waiting longer could win the lease after the run it waited for was done, and run it again", opts.Wait, opts.Hold))
	}
	if len(problems) > 0 {
		return nil, &baton.ConfigError{Problems: problems}
	}
	if opts.Candidate.ID == "" {
		opts.Candidate.ID = baton.NewCandidateID()
	}
	if opts.LeaseName == nil {
		prefix := opts.Prefix
		opts.LeaseName = func(key string) string { return prefix + url.PathEscape(key) }
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Locker{
		b:      b,
		opts:   opts,
		log:    log.WithGroup("gocronbaton").With("id", opts.Candidate.ID),
		ctx:    ctx,
		cancel: cancel,
		keys:   map[string]*keyState{},
	}, nil
}

// ID returns the candidate ID the Locker campaigns with.
func (l *Locker) ID() string { return l.opts.Candidate.ID }

// Lock implements gocron.Locker: it returns a lock on key's lease, or an
// error wrapping ErrLocked when another instance holds it (at once), when
// another run in this instance holds it (at once), or when the lease was not
// won within Wait; the campaign's error (wrapping
// baton.ErrBackendUnavailable) when the backend cannot be reached; one
// matching *baton.ConfigError when the backend refuses the configuration,
// which no retry fixes (then for every later Lock of the key too, without
// a campaign); and baton.ErrClosed after Close. Failed campaigns are a
// back-off apart (baton.Backoff's defaults: up to baton.DefaultRetryMax).
// ctx bounds the wait too. gocron skips the run on any error.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("gocronbaton: lock %q: %w", key, baton.ErrClosed)
	}
	ks := l.keys[key]
	if ks == nil {
		ks = &keyState{key: key, lease: l.opts.LeaseName(key), changed: make(chan struct{}), kick: make(chan struct{}, 1)}
		l.keys[key] = ks
		l.wg.Go(func() { l.serve(ks) })
	}
	if lk := l.claimLocked(ks); lk != nil {
		l.mu.Unlock()
		return lk, nil // still held from an earlier run: reuse it
	}
	if ks.user != nil && ks.user.t.Err() == nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: %q is being run by this instance (token %d)", ErrLocked, key, ks.user.t.Token())
	}
	if ks.err != nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("gocronbaton: lock %q: %w", key, ks.err)
	}
	ks.want = true
	ks.waiters++
	fails := ks.fails
	poke(ks.kick)
	l.mu.Unlock()

	// Fail fast when somebody else holds it; the campaign goes on as a
	// standby.
	rec, err := l.b.Leader(ctx, ks.lease)
	heldElsewhere := err == nil && rec.Holder != l.opts.Candidate.ID
	timer := time.NewTimer(l.opts.Wait)
	defer timer.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	// Every return below leaves with l.mu held, so that giving up and the
	// count of waiters change together with what the key's goroutine sees.
	defer func() {
		ks.waiters--
		if ks.waiters == 0 && ks.unclaimed && ks.user == nil {
			// Won for Locks that have all given up: release it now rather
			// than hold it idle, which would make the other instances skip.
			ks.until = time.Now()
			poke(ks.kick)
		}
	}()
	for {
		if lk := l.claimLocked(ks); lk != nil {
			return lk, nil
		}
		switch {
		case heldElsewhere:
			return nil, fmt.Errorf("%w: %q is held by %s (token %d)", ErrLocked, key, rec.Holder, rec.Token)
		case ks.fails != fails:
			return nil, fmt.Errorf("gocronbaton: lock %q: %w", key, ks.lastErr)
		}
		changed := ks.changed
		l.mu.Unlock()
		var err error
		select {
		case <-changed:
		case <-timer.C:
			err = fmt.Errorf("%w: %q was not won within %s", ErrLocked, key, l.opts.Wait)
		case <-ctx.Done():
			err = fmt.Errorf("gocronbaton: lock %q: %w", key, ctx.Err())
		case <-l.ctx.Done():
			err = fmt.Errorf("gocronbaton: lock %q: %w", key, baton.ErrClosed)
		}
		l.mu.Lock()
		if err != nil {
			// Even if the lease was won meanwhile: a claim after Wait
			// could come after the run we waited for was done elsewhere.
			return nil, err
		}
	}
}

// claimLocked hands ks's term to a new run if it is held, idle and live.
func (l *Locker) claimLocked(ks *keyState) *lock {
	if ks.term == nil || ks.user != nil {
		return nil
	}
	select {
	case <-ks.term.Done():
		return nil
	default:
	}
	if closed(baton.ResignRequestedOf(ks.term)) {
		return nil // a resign was requested: no new run on this term
	}
	now := time.Now()
	if ks.term.SafeUntil().Sub(now) <= l.opts.MinRemaining {
		return nil
	}
	lk := &lock{l: l, ks: ks, t: ks.term}
	ks.user, ks.unclaimed = lk, false
	if hold := now.Add(l.opts.Hold); hold.After(ks.until) {
		ks.until = hold
	}
	poke(ks.kick)
	return lk
}

// Unlock implements gocron.Lock. The lease is released after the rest of
// Hold, in the background. It returns an error wrapping ErrLockLost (and the
// term's reason) when the term ended before Unlock.
func (lk *lock) Unlock(ctx context.Context) error {
	l := lk.l
	// Whether the term outlived the run is read before the run lets go of
	// it: from then on the key's goroutine may resign it (at once, when a
	// resign was requested), which is no loss.
	err := lk.t.Err()
	l.mu.Lock()
	if lk.ks.user == lk {
		lk.ks.user = nil
		poke(lk.ks.kick)
	}
	l.mu.Unlock()
	if err != nil {
		l.log.Warn("a run outlived its lock: the term ended before Unlock", "key", lk.ks.key, "token", lk.t.Token(), "reason", err)
		return fmt.Errorf("%w: %q (token %d): %w", ErrLockLost, lk.ks.key, lk.t.Token(), err)
	}
	return nil
}

// Job wraps fn as a gocron task function for the job named key (give the job
// that name with gocron.WithName): fn runs with a context that also ends when
// the lock's term ends (and carries it, see TermFromContext). It returns an
// error wrapping ErrNotLocked, without calling fn, when the run does not hold
// key's lock.
func (l *Locker) Job(key string, fn func(ctx context.Context, t baton.Term) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		l.mu.Lock()
		var t baton.Term
		if ks := l.keys[key]; ks != nil && ks.user != nil {
			t = ks.user.t
		}
		l.mu.Unlock()
		if t == nil {
			return fmt.Errorf("%w: %q", ErrNotLocked, key)
		}
		jctx, stop := termContext(ctx, t)
		defer stop()
		return fn(jctx, t)
	}
}

// serve is the goroutine of one key: campaign on demand (baton.Campaign),
// hold (baton.Lead), release.
func (l *Locker) serve(ks *keyState) {
	var bo baton.Backoff
	lc := baton.LeadConfig{ResignTimeout: l.opts.ResignTimeout, Logger: l.log.With("key", ks.key, "lease", ks.lease)}
	for {
		l.mu.Lock()
		want := ks.want
		l.mu.Unlock()
		if !want {
			select {
			case <-ks.kick:
				continue
			case <-l.ctx.Done():
				return
			}
		}
		t, err := baton.Campaign(l.ctx, l.b, ks.lease, l.opts.Candidate, &bo, func(err error, _ time.Duration) bool {
			// Campaign on while a Lock waits; else stand down after the
			// back-off, until the next Lock.
			return l.failed(ks, err, nil)
		})
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			var ce *baton.ConfigError
			if errors.Is(err, baton.ErrClosed) || errors.As(err, &ce) {
				// The Backend is gone, or refuses the configuration: no
				// retry fixes that, and later Locks fail at once.
				l.failed(ks, err, err)
				return
			}
			continue // failed said to stand down
		}
		bo.Reset()

		l.mu.Lock()
		ks.term, ks.user, ks.until, ks.unclaimed = t, nil, time.Now(), true
		if ks.waiters > 0 {
			ks.until = ks.until.Add(l.opts.Hold)
		} // else a standby won: nobody wants it, release at once
		l.broadcastLocked(ks)
		l.mu.Unlock()

		_ = baton.Lead(l.ctx, t, lc, func(ctx context.Context, t baton.Term) error {
			l.hold(ctx, ks, t)
			return nil
		})

		l.mu.Lock()
		if ks.term == t {
			ks.term = nil
		}
		ks.want = ks.waiters > 0
		l.broadcastLocked(ks)
		l.mu.Unlock()
	}
}

// failed records a failed campaign of ks for the Locks waiting on it, and
// reports whether one still waits; fatal, when not nil, is the error that
// later Locks fail with at once.
func (l *Locker) failed(ks *keyState, err, fatal error) bool {
	l.log.Warn("campaign failed", "key", ks.key, "lease", ks.lease, "err", err)
	l.mu.Lock()
	defer l.mu.Unlock()
	ks.want = ks.waiters > 0
	ks.fails++
	ks.lastErr = err
	if fatal != nil {
		ks.err = fatal
	}
	l.broadcastLocked(ks)
	return ks.want
}

// hold returns when t should be released — no run uses it and Hold has
// passed, or no run uses it and a resign was requested from outside
// (baton.ResignRequestTerm) — or ctx ended otherwise: t ended, it reached
// its safe-until, or the Locker is closing. A requested resign thus waits
// for the run that uses t to return, so the lease is released only after
// the job stopped.
func (l *Locker) hold(ctx context.Context, ks *keyState, t baton.Term) {
	// Whatever ends the hold, t is on its way to release: no Lock may
	// claim it from here on.
	defer func() {
		l.mu.Lock()
		if ks.term == t {
			ks.term = nil
		}
		l.mu.Unlock()
	}()
	requested := false
	done := ctx.Done()
	for {
		l.mu.Lock()
		busy := ks.user != nil && ks.user.t == t
		left := time.Until(ks.until)
		if !busy && (left <= 0 || requested) {
			// Decided under the same lock as claimLocked's check, so that
			// a Lock cannot claim t between this decision and the resign.
			ks.term = nil
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		var timeout <-chan time.Time
		var timer *time.Timer
		if !busy {
			timer = time.NewTimer(left)
			timeout = timer.C
		}
		stop := false
		select {
		case <-done:
			// A requested resign goes on until no run uses t; any other
			// end of ctx ends the hold.
			requested, done = true, nil
			stop = t.Err() != nil || l.ctx.Err() != nil || !errors.Is(context.Cause(ctx), baton.ErrResigned)
		case <-t.Done():
			stop = true
		case <-l.ctx.Done():
			stop = true
		case <-ks.kick:
		case <-timeout:
		}
		if timer != nil {
			timer.Stop()
		}
		if stop {
			return
		}
	}
}

// Close stops every campaign and releases every lease the Locker holds,
// including one a run still uses (whose Job context then ends), and waits
// for its goroutines, or for ctx. Close the Locker after the scheduler has
// shut down. Later Locks fail with an error wrapping baton.ErrClosed.
func (l *Locker) Close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gocronbaton: close: %w", ctx.Err())
	}
}

func (l *Locker) broadcastLocked(ks *keyState) {
	close(ks.changed)
	ks.changed = make(chan struct{})
}

// poke wakes the goroutine reading ch without blocking.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// closed reports whether c is closed; a nil c never is.
func closed(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}
