//go:build linux && !batonpgroup

package supervise

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// renewedTerm is a term whose safe-until moves from first to later after
// it was first read, as a renewal confirmed while the guard was starting
// moves it, and then never moves again.
type renewedTerm struct {
	reads        atomic.Int32
	first, later time.Time
	done         chan struct{}
}

func (t *renewedTerm) SafeUntil() time.Time {
	if t.reads.Add(1) == 1 {
		return t.first
	}
	return t.later
}
func (t *renewedTerm) Done() <-chan struct{} { return t.done }
func (t *renewedTerm) Err() error            { return nil }

// A renewal confirmed while the guard was starting moved the term's
// safe-until past the deadline the guard started with; the TermProcess
// passes it on although it sees no move after it began, so the guard does
// not stop the command of a healthy term.
func TestStartTermPassesOnARenewalDuringStart(t *testing.T) {
	started := time.Now().Add(500 * time.Millisecond)
	term := &renewedTerm{first: started, later: time.Now().Add(time.Minute), done: make(chan struct{})}
	p, err := StartTerm(term, Config{
		Command: []string{"sleep", "1000"},
		Grace:   100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(t.Context())
		p.Close()
	})
	select {
	case <-p.Done():
		t.Fatalf("the guard stopped the command of a term safe for a minute: %v", p.Err())
	case <-time.After(time.Until(started) + time.Second): // past the start deadline
	}
}

// movingTerm is a term whose safe-until is set by the test, and which
// counts how often it is read.
type movingTerm struct {
	reads     atomic.Int32
	safeUntil atomic.Pointer[time.Time]
	done      chan struct{}
}

func newMovingTerm(su time.Time) *movingTerm {
	t := &movingTerm{done: make(chan struct{})}
	t.safeUntil.Store(&su)
	return t
}

func (t *movingTerm) SafeUntil() time.Time {
	t.reads.Add(1)
	return *t.safeUntil.Load()
}
func (t *movingTerm) Done() <-chan struct{} { return t.done }
func (t *movingTerm) Err() error            { return nil }

// A TermProcess whose term is safe for a minute does not look at its
// safe-until again for about half a minute: an idle holder's process
// sleeps between renewals instead of waking every TermPoll (with a
// ticker of TermPoll it reads it about 100 times in the two seconds
// watched here).
func TestStartTermLooksRarelyWhileSafe(t *testing.T) {
	term := newMovingTerm(time.Now().Add(time.Minute))
	p, err := StartTerm(term, Config{Command: []string{"sleep", "1000"}, Grace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(t.Context())
		p.Close()
	})
	select {
	case <-p.Done():
		t.Fatalf("the guard stopped the command of a term safe for a minute: %v", p.Err())
	case <-time.After(2 * time.Second): // the window watched, not synchronisation
	}
	// StartTerm's read, the first look after TermPoll; nothing more until
	// about 30 s.
	if n := term.reads.Load(); n > 3 {
		t.Errorf("safe-until was read %d times in 2 s of a term safe for a minute; want at most 3", n)
	}
}

// A renewal confirmed late, well before the guard would act but after
// the TermProcess's looks have spread out, still reaches the guard in
// time: the looks come closer together as the guard's moment nears, so
// the command of a term that goes on is not stopped.
func TestStartTermPassesOnALateRenewal(t *testing.T) {
	start := time.Now()
	term := newMovingTerm(start.Add(3 * time.Second))
	p, err := StartTerm(term, Config{Command: []string{"sleep", "1000"}, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(t.Context())
		p.Close()
	})
	// The guard would act 2 s after start; renew at 1.5 s.
	select {
	case <-p.Done():
		t.Fatalf("the guard stopped the command before its deadline: %v", p.Err())
	case <-time.After(time.Until(start.Add(1500 * time.Millisecond))):
	}
	later := time.Now().Add(time.Minute)
	term.safeUntil.Store(&later)
	select {
	case <-p.Done():
		t.Fatalf("the guard stopped the command of a term renewed before the guard's moment: %v", p.Err())
	case <-time.After(time.Until(start.Add(3 * time.Second))): // past the first deadline
	}
}

// A term whose renewals stop: the guard still stops the command at its
// safe-until less the grace, as the caller would, although the
// TermProcess looks at safe-until only now and then while it is far off.
func TestStartTermStopsAtSafeUntilWhenRenewalsStop(t *testing.T) {
	su := time.Now().Add(2 * time.Second)
	term := newMovingTerm(su)
	p, err := StartTerm(term, Config{Command: []string{"sleep", "1000"}, Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(t.Context())
		p.Close()
	})
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatal("the guard did not stop the command of a term past its safe-until")
	}
	if !errors.Is(p.Err(), ErrDeadline) {
		t.Fatalf("the command ended with %v; want ErrDeadline", p.Err())
	}
	if now := time.Now(); now.After(su) {
		t.Errorf("the command was stopped %s after safe-until; want by safe-until", now.Sub(su))
	}
}
