package gocronbaton

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/go-co-op/gocron/v2"
)

// ElectorOptions configures an Elector. The zero value means the documented
// defaults.
type ElectorOptions struct {
	// MinRemaining makes IsLeader refuse to start a run when less than this
	// is left before the term's safe-until deadline: renewals are lagging,
	// and a run started now would likely be cut short. Zero (the default)
	// means any time left will do. In healthy operation safe-until stays at
	// least TTL − RenewInterval − DriftMargin ahead, so keep it below that.
	MinRemaining time.Duration
}

// Elector adapts a baton.Elector to gocron.Elector: only the instance that
// holds the Elector's lease runs jobs. Drive the baton.Elector with Run, or
// call Lead from your own callback. Safe for concurrent use.
type Elector struct {
	e    *baton.Elector
	opts ElectorOptions

	mu  sync.Mutex
	cur *leadership // the term Lead is in, nil outside Lead
}

var _ gocron.Elector = (*Elector)(nil)

// leadership tracks the runs wrapped with Job during one term.
type leadership struct {
	t      baton.Term
	ctx    context.Context // Lead's context: ends with the term
	ending bool            // Lead is winding down: no new runs
	runs   sync.WaitGroup
}

// NewElector returns an Elector backed by e. Create e with
// baton.NewElector(backend, baton.ElectorConfig{Lease: "cron"}).
func NewElector(e *baton.Elector, opts ElectorOptions) (*Elector, error) {
	var problems []string
	if e == nil {
		problems = append(problems, "gocronbaton: Elector is nil: pass one from baton.NewElector")
	}
	if opts.MinRemaining < 0 {
		problems = append(problems, fmt.Sprintf("gocronbaton: MinRemaining (%s) must not be negative", opts.MinRemaining))
	}
	if len(problems) > 0 {
		return nil, &baton.ConfigError{Problems: problems}
	}
	return &Elector{e: e, opts: opts}, nil
}

// Run campaigns for the lease until ctx ends, holding it while it leads: it
// is e.Run(ctx, el.Lead). It returns as baton.Elector.Run does.
func (el *Elector) Run(ctx context.Context) error {
	return el.e.Run(ctx, el.Lead)
}

// Lead is a baton.Elector callback: it holds the lease until the term ends
// or ctx is cancelled, then stops the runs wrapped with Job (their contexts
// end) and waits for them to return, so that the lease is released only
// after them. Call it from your own callback if the Elector does other
// leader work too.
func (el *Elector) Lead(ctx context.Context, t baton.Term) error {
	l := &leadership{t: t, ctx: ctx}
	el.mu.Lock()
	el.cur = l
	el.mu.Unlock()

	<-ctx.Done()

	el.mu.Lock()
	l.ending = true // no run may join the wait group from now on
	el.mu.Unlock()
	l.runs.Wait()
	el.mu.Lock()
	if el.cur == l {
		el.cur = nil
	}
	el.mu.Unlock()
	return nil
}

// IsLeader implements gocron.Elector: nil when this instance holds the lease,
// Lead runs on its term, and the term is live with at least MinRemaining
// left; an error wrapping ErrNotLeader otherwise — also when it cannot tell,
// for example because the backend is unreachable and no term is held. It
// does not contact the backend.
func (el *Elector) IsLeader(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	el.mu.Lock()
	cur := el.cur
	ending := cur != nil && cur.ending
	el.mu.Unlock()
	if ending {
		return fmt.Errorf("%w: handing over lease %q", ErrNotLeader, el.e.Status().Lease)
	}
	s := el.e.Status()
	t := s.Term
	if t == nil {
		if s.LastError != nil {
			return fmt.Errorf("%w: lease %q (last: %w)", ErrNotLeader, s.Lease, s.LastError)
		}
		return fmt.Errorf("%w: lease %q", ErrNotLeader, s.Lease)
	}
	if cur == nil || cur.t != t {
		// Elected, but Lead has not started on the term: a run now would
		// find no term to join (Job), so it must not start.
		return fmt.Errorf("%w: lease %q (token %d) is not held by Lead yet", ErrNotLeader, t.Lease(), t.Token())
	}
	if left := time.Until(t.SafeUntil()); left < el.opts.MinRemaining {
		return fmt.Errorf("%w: the term of lease %q (token %d) is safe for %s only, below MinRemaining %s",
			ErrNotLeader, t.Lease(), t.Token(), left.Round(time.Millisecond), el.opts.MinRemaining)
	}
	return nil
}

// Job wraps fn as a gocron task function: fn runs with a context that also
// ends when the term ends (and carries it, see TermFromContext), and the
// hand-over waits for it. The wrapper returns an error wrapping
// ErrNotLeader without calling fn if the term ended between gocron's
// IsLeader check and the run. It needs the Elector driven by Run or Lead.
//
//	s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(el.Job(func(ctx context.Context, t baton.Term) error {
//		return store.Write(ctx, t.Token(), ...)
//	})))
func (el *Elector) Job(fn func(ctx context.Context, t baton.Term) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		el.mu.Lock()
		l := el.cur
		if l == nil || l.ending || l.ctx.Err() != nil {
			el.mu.Unlock()
			return fmt.Errorf("%w: the term ended before the run started", ErrNotLeader)
		}
		l.runs.Add(1)
		el.mu.Unlock()
		defer l.runs.Done()

		jctx, stop := termContext(l.ctx, l.t)
		defer stop()
		// gocron's context ends when the job is removed or the scheduler
		// shuts down: the run should stop then too.
		jctx, cancel := context.WithCancel(jctx)
		defer cancel()
		unhook := context.AfterFunc(ctx, cancel)
		defer unhook()
		return fn(jctx, l.t)
	}
}
