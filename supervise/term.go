//go:build linux || darwin

package supervise

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"
)

// Term is what StartTerm needs of a term of a lease: a baton.Term
// satisfies it.
type Term interface {
	// SafeUntil is the instant up to which no other holder can have the
	// lease; it moves on with each confirmed renewal.
	SafeUntil() time.Time
	// Done is closed when the term ends.
	Done() <-chan struct{}
	// Err says why the term ended; nil before.
	Err() error
}

// TermPoll is the shortest time between two looks of a TermProcess at its
// term's safe-until, which it passes on to the guard when it moved. A term
// has no notification of a renewal, so the TermProcess looks half-way to
// the moment the guard would act on the deadline it has (the deadline less
// the grace), then half-way again, and so on down to every TermPoll: a
// renewal moves safe-until on long before that moment, so a term whose
// renewals keep up costs a few wake-ups per renewal, not one per TermPoll,
// while the last stretch before the guard acts is watched every TermPoll.
// The guard's deadline only ever lags safe-until, never leads it, so the
// guard stops the command no later than the caller would (earlier, by up to
// the time since the last look, when the caller hangs or is stopped).
const TermPoll = 20 * time.Millisecond

// TermProcess is a command run for one term of a lease: started under a
// guard whose deadline is the term's safe-until, moved on as renewals move
// safe-until, with the signals of DefaultForwardSignals relayed to it. A
// caller that hangs or is stopped passes nothing on, and the guard stops
// the command by the last safe-until it got. Its methods are safe for
// concurrent use.
type TermProcess struct {
	*Process
	t       Term
	grace   time.Duration // the guard's: it acts at the deadline less grace
	started time.Time

	stopForward func()
	quit        chan struct{}
	extended    chan struct{}
	closeOnce   sync.Once
}

// StartTerm starts cfg.Command for term t, as Start does, with
// cfg.Deadline set to t's safe-until. Call Close when done with it (after
// End, or Process.Stop once it exited by itself): it ends the relaying of
// safe-until and of signals.
func StartTerm(t Term, cfg Config) (*TermProcess, error) {
	cfg.Deadline = t.SafeUntil()
	p, err := Start(cfg)
	if err != nil {
		return nil, err
	}
	tp := &TermProcess{
		Process:  p,
		t:        t,
		grace:    cmp.Or(cfg.Grace, DefaultGrace),
		started:  time.Now(),
		quit:     make(chan struct{}),
		extended: make(chan struct{}),
	}
	// Relayed until the command is gone, including during its grace
	// period, when a SIGQUIT for a stack dump is most useful.
	tp.stopForward = p.Forward(context.Background())
	go tp.extend()
	return tp, nil
}

// extend passes each move of the term's safe-until on to the guard, until
// the term ends, the guard is gone, or Close.
func (tp *TermProcess) extend() {
	defer close(tp.extended)
	// The first look always sends: a renewal confirmed while the guard was
	// starting moved safe-until past the deadline it started with.
	var sent time.Time
	look := time.NewTimer(TermPoll)
	defer look.Stop()
	for {
		select {
		case <-tp.quit:
			return
		case <-tp.t.Done():
			return
		case <-look.C:
		}
		if su := tp.t.SafeUntil(); su.After(sent) {
			if err := tp.Extend(su); err != nil {
				return // the guard is gone, or hung: it stops the command itself
			}
			sent = su
		}
		look.Reset(nextLook(time.Until(sent) - tp.grace))
	}
}

// nextLook is how long a TermProcess waits before it looks at safe-until
// again, given slack, the time left until its guard would act on the
// deadline it has: half of that, so that a look delayed by a busy host
// still comes before the guard acts, and at least TermPoll.
func nextLook(slack time.Duration) time.Duration {
	return max(slack/2, TermPoll)
}

// Wait waits until the command exits by itself, which it reports as true,
// or until ctx ends or the guard stopped the command at the term's deadline
// (the term is over, though the caller may not have noticed yet), reported
// as false: the caller then stops it with End.
func (tp *TermProcess) Wait(ctx context.Context) (exited bool) {
	select {
	case <-tp.Done():
		return !errors.Is(tp.Err(), ErrDeadline)
	case <-ctx.Done():
		return false
	}
}

// Ran is how long the command has run, or ran.
func (tp *TermProcess) Ran() time.Duration { return time.Since(tp.started) }

// End stops the command and everything it left behind at the end of its
// term, or after it exited by itself, and waits for that. Not with the
// term's context: that has ended, and Stop must still allow the grace, but
// never past safe-until (less KillLead, so that the caller's own kill has
// landed by then should the guard not answer), after which another holder
// may lead. (Stopping a grace before safe-until, as baton.ElectorConfig's
// StopEarly does, leaves a full grace; a term lost outright or won late
// may not.) It returns what Stop returns.
func (tp *TermProcess) End() error {
	sctx, cancel := context.WithDeadline(context.Background(), tp.t.SafeUntil().Add(-KillLead))
	defer cancel()
	return tp.Process.Stop(sctx)
}

// Reason is why the command was stopped, once ctx (the context the term's
// work ran under) ended or the guard stopped it: the term's error, or,
// before the term has one, ctx's cause (renewals lagging into StopEarly,
// say), or the guard's stopping the command at safe-until before the
// caller noticed the lag.
func (tp *TermProcess) Reason(ctx context.Context) error {
	if err := tp.t.Err(); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return tp.Err()
}

// Close ends the relaying of safe-until and signals, and waits for it.
func (tp *TermProcess) Close() {
	tp.closeOnce.Do(func() {
		close(tp.quit)
		<-tp.extended
		tp.stopForward()
	})
}
