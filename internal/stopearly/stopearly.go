// Package stopearly ends the work of a term when the term ends, or a set
// time before its safe-until when renewals lag: the watchdog that the
// Elector and the balance Group put around their callbacks.
package stopearly

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrStoppedEarly is what the cause of Watch's cancel wraps when renewals
// lag. Package baton exports it as baton.ErrStoppedEarly.
var ErrStoppedEarly = errors.New("baton: renewals lag: stopping the work before safe-until")

// Term is what Watch needs of a baton.Term (this package cannot import
// baton, which imports it).
type Term interface {
	SafeUntil() time.Time
	Done() <-chan struct{}
	Err() error
}

// Watch calls cancel with t.Err() when t ends, or, once safe-until minus
// early has passed (renewals lag: safe-until stopped moving), with an error
// wrapping ErrStoppedEarly that says how far safe-until is; lagged, when not
// nil, is called first with that distance, to log it. A term from a
// third-party backend might not end itself at its safe-until, and early
// wants the work out sooner, so the deadline is enforced here too. The
// returned stop ends the watch, and returns once it has ended: after stop,
// cancel is not called.
func Watch(t Term, early time.Duration, cancel context.CancelCauseFunc, lagged func(left time.Duration)) (stop func()) {
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
				if lagged != nil {
					lagged(left)
				}
				cancel(Lagging(left, early))
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// Lagging is the cause Watch gives when renewals lag, with safe-until left
// away and early the StopEarly setting.
func Lagging(left, early time.Duration) error {
	return fmt.Errorf("%w: no renewal confirmed, and safe-until is %s away, within StopEarly (%s)",
		ErrStoppedEarly, left.Round(time.Millisecond), early)
}

// ResignRequested returns the cause Requested gives: an error wrapping
// resigned (baton.ErrResigned, which this package cannot import) that says
// a resign was requested.
func ResignRequested(resigned error) error {
	return fmt.Errorf("%w: a resign was requested: stopping the work, then releasing the lease", resigned)
}

// Requested calls cancel with cause when req is closed — a resign of t was
// requested from outside (baton.ResignRequestTerm) — unless t ends first. A
// nil req never fires. The work stops while t goes on; whoever called
// Requested resigns once the work has returned. The returned stop ends the
// watch, and returns once it has ended: after stop, cancel is not called.
func Requested(t Term, req <-chan struct{}, cause error, cancel context.CancelCauseFunc) (stop func()) {
	if req == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-req:
			cancel(cause)
		case <-t.Done():
		case <-done:
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
