//go:build linux || darwin

package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/batonhq/baton"
)

// Timing of Runner.Run and Runner.Start.
const (
	// QuickExit is how long a command must run for Runner.Run to campaign
	// again at once after it exits; a command that fails faster waits
	// RestartDelay first, so that a crash loop does not hammer the backend
	// or flap the leadership between instances.
	QuickExit = time.Second
	// RestartDelay is that wait.
	RestartDelay = time.Second
	// PrepareDelay is how long after a command's start a Runner with
	// Prepare starts the guard of the next one (see Prepare): not at once,
	// where the two starts would compete for the CPU.
	PrepareDelay = 500 * time.Millisecond
)

// ErrTermEnded is returned by Runner.Lead, with Runner.Once, when the term
// ended (lost, expired, renewals lagging, a resign requested) while the
// command ran: the command was stopped.
var ErrTermEnded = errors.New("supervise: the term ended while the command ran: the command was stopped")

// ExitError is returned by Runner.Lead when the command exited by itself
// while the term lasted.
type ExitError struct {
	// Code is the command's exit status (128+S when killed by signal S),
	// or -1 when its guard died before reporting one.
	Code int
	// Ran is how long the command ran.
	Ran time.Duration
}

// Error implements error.
func (e *ExitError) Error() string {
	return fmt.Sprintf("command exited with status %d after %s", e.Code, e.Ran.Round(time.Millisecond))
}

// Elector is what Runner.Run needs of a *baton.Elector.
type Elector interface {
	Run(ctx context.Context, fn func(ctx context.Context, t baton.Term) error) error
}

// Runner runs a command for each term of a lease, under a guard that stops
// it and every descendant by the term's safe-until (StartTerm): what
// `baton run` does. Run drives it from a baton.Elector; Lead runs one term
// (a callback for baton.Elector.Run or baton.Lead). Set the fields before
// the first use; its methods are then safe for concurrent use. Call Close
// when done.
type Runner struct {
	// Config is the command. Its Deadline is each term's safe-until; its
	// Env (nil: this process's environment) gets BATON_LEASE,
	// BATON_TOKEN and BATON_HOLDER added for each term; its Logger
	// receives the guard's lines, with the term's token.
	Config Config

	// Holder is the candidate ID the command gets as BATON_HOLDER.
	Holder string

	// Once makes Run return after the first term that ran the command:
	// with the command's *ExitError (also for status 0) when it exited by
	// itself, or ErrTermEnded when the term ended under it.
	Once bool

	// Prepare makes the Runner start the next command's guard
	// PrepareDelay after each command starts (see Prepare), so that the
	// next term's command does not wait for one. Only for commands whose
	// streams are files (Prepare's condition); Close discards it.
	Prepare bool

	// Logger receives the Runner's lines (a command stopped, exited,
	// restarted). Nil means silent.
	Logger *slog.Logger

	bg      sync.WaitGroup
	mu      sync.Mutex
	quit    chan struct{}
	closing bool
}

func (r *Runner) log() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

// Run runs the command for each term e wins, until ctx ends: it calls
// e.Run(ctx, r.Lead) again after the command exited by itself (after
// RestartDelay when it ran less than QuickExit), so that the Elector
// resigns and campaigns again. It returns what e.Run returns otherwise:
// ctx's error when ctx ends, with Once the first term's *ExitError or
// ErrTermEnded.
func (r *Runner) Run(ctx context.Context, e Elector) error {
	for {
		err := e.Run(ctx, r.Lead)
		var exited *ExitError
		if !errors.As(err, &exited) || r.Once {
			return err
		}
		r.log().Warn("command exited while leading; resigned and campaigning again", "exit_code", exited.Code, "ran", exited.Ran)
		if exited.Ran < QuickExit {
			r.log().Info("command exited quickly; waiting before campaigning again", "delay", RestartDelay)
			t := time.NewTimer(RestartDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}
}

// Lead runs the command for term t until it exits by itself, which it
// returns as *ExitError, or until ctx ends (the term ended, renewals lag,
// a resign was requested, or the caller stops); it then stops the command
// and what it left behind, and returns nil (with Once, ErrTermEnded when
// the term, not the caller, ended it). It starts nothing when ctx has
// ended already.
func (r *Runner) Lead(ctx context.Context, t baton.Term) error {
	if ctx.Err() != nil {
		return nil
	}
	log := r.log().With("token", t.Token())
	p, err := r.Start(t, nil)
	if err != nil {
		return fmt.Errorf("leading, but the command could not be started (resigned): %w", err)
	}
	defer p.Close()
	if p.Wait(ctx) {
		ran := p.Ran()
		// End also removes what the command left behind.
		r.End(p)
		return &ExitError{Code: p.ExitCode(), Ran: ran}
	}
	byCaller := stoppedByCaller(ctx, t)
	if byCaller {
		log.Info("stopping the command before resigning", "cause", context.Cause(ctx))
	} else {
		log.Warn("term ended; stopping the command", "reason", p.Reason(ctx))
	}
	r.End(p)
	log.Info("command stopped", "exit_code", p.ExitCode())
	if r.Once && !byCaller {
		return ErrTermEnded
	}
	return nil
}

// stoppedByCaller reports whether the work's context ended because its
// caller stops (a signal, a cancelled Run), rather than because of the
// term: it ended, renewals lag, or a resign was requested.
func stoppedByCaller(ctx context.Context, t baton.Term) bool {
	cause := context.Cause(ctx)
	return ctx.Err() != nil && t.Err() == nil && !errors.Is(cause, baton.ErrStoppedEarly) && !errors.Is(cause, baton.ErrResigned)
}

// Start starts the command for term t with env added to its environment
// after the BATON_ variables, and logAttrs added to the guard's log lines.
// The caller Waits for it, Ends it and Closes it.
func (r *Runner) Start(t baton.Term, env []string, logAttrs ...any) (*TermProcess, error) {
	cfg := r.Config
	base := cfg.Env
	if base == nil {
		base = os.Environ()
	}
	cfg.Env = append(append(append([]string(nil), base...),
		"BATON_LEASE="+t.Lease(),
		"BATON_TOKEN="+strconv.FormatUint(t.Token(), 10),
		"BATON_HOLDER="+r.Holder), env...)
	if cfg.Logger != nil {
		cfg.Logger = cfg.Logger.With(append([]any{"token", t.Token()}, logAttrs...)...)
	}
	p, err := StartTerm(t, cfg)
	if err == nil && r.Prepare {
		r.prepareNext()
	}
	return p, err
}

// End stops p's command and what it left behind, and waits for that. A
// caller that is a subreaper (BecomeSubreaper) loses no descendant even to
// a guard killed by another process; should one be lost all the same, End
// logs it.
func (r *Runner) End(p *TermProcess) {
	if err := p.End(); errors.Is(err, ErrDescendantsLost) {
		r.log().Error("the command's guard was killed; descendants of the command may still run", "err", err)
	}
}

// prepareNext starts the next command's guard PrepareDelay from now, in
// the background, unless the Runner closes first.
func (r *Runner) prepareNext() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return
	}
	if r.quit == nil {
		r.quit = make(chan struct{})
	}
	quit := r.quit
	r.bg.Go(func() {
		t := time.NewTimer(PrepareDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-quit:
			return
		}
		if err := Prepare(nil, r.Config.Stdout, r.Config.Stderr); err != nil {
			r.log().Warn("could not start the next command's guard ahead of time; it will start with the command", "err", err)
		}
	})
}

// Close stops preparing guards and waits for the Runner's background
// work. It does not Discard a guard already prepared. Calling it again
// does nothing more.
func (r *Runner) Close() {
	r.mu.Lock()
	if !r.closing && r.quit != nil {
		close(r.quit)
	}
	r.closing = true
	r.mu.Unlock()
	r.bg.Wait()
}
