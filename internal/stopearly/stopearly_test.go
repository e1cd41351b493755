package stopearly_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/stopearly"
)

// A term that ends cancels with its error.
func TestTermEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Hour), nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		stop := stopearly.Watch(term, time.Second, cancel, nil)
		defer stop()
		term.End(baton.ErrLeaseLost)
		<-ctx.Done()
		if cause := context.Cause(ctx); !errors.Is(cause, baton.ErrLeaseLost) {
			t.Errorf("cause = %v, want the term's ErrLeaseLost", cause)
		}
	})
}

// Renewals that move safe-until on keep the work going; once they stop,
// the work is cancelled early before safe-until, with ErrStoppedEarly.
func TestLaggingRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const early = 2 * time.Second
		term := backend.NewBasicTerm("l", 1, time.Now().Add(10*time.Second), nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		var lagged []time.Duration
		stop := stopearly.Watch(term, early, cancel, func(left time.Duration) { lagged = append(lagged, left) })
		defer stop()
		for range 5 {
			time.Sleep(5 * time.Second)
			term.Extend(time.Now().Add(10 * time.Second))
		}
		if ctx.Err() != nil {
			t.Fatalf("cancelled while renewals kept safe-until ahead: %v", context.Cause(ctx))
		}
		last := term.SafeUntil()
		<-ctx.Done()
		if got := last.Sub(time.Now()); got != early {
			t.Errorf("cancelled %s before safe-until, want %s", got, early)
		}
		if cause := context.Cause(ctx); !errors.Is(cause, stopearly.ErrStoppedEarly) || !strings.Contains(cause.Error(), "safe-until is 2s away, within StopEarly (2s)") {
			t.Errorf("cause = %v, want ErrStoppedEarly naming the distance to safe-until", cause)
		}
		if len(lagged) != 1 || lagged[0] != early {
			t.Errorf("lagged called with %v, want once with %s", lagged, early)
		}
	})
}

// After stop, nothing is cancelled.
func TestStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Second), nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		stopearly.Watch(term, 0, cancel, nil)()
		term.End(baton.ErrLeaseLost)
		time.Sleep(2 * time.Second)
		if ctx.Err() != nil {
			t.Errorf("cancelled after stop: %v", context.Cause(ctx))
		}
	})
}

// A requested resign cancels the work with the given cause and leaves the
// term running; a term that ends first, or a stopped watch, cancels
// nothing.
func TestRequested(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errAsked := errors.New("asked")
		term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Hour), nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		stop := stopearly.Requested(term, term.ResignRequested(), errAsked, cancel)
		defer stop()
		term.RequestResign(baton.ErrResigned)
		<-ctx.Done()
		if cause := context.Cause(ctx); cause != errAsked {
			t.Errorf("cause = %v, want %v", cause, errAsked)
		}
		if term.Err() != nil {
			t.Errorf("the request ended the term: %v", term.Err())
		}

		ended := backend.NewBasicTerm("l", 2, time.Now().Add(time.Hour), nil)
		ctx2, cancel2 := context.WithCancelCause(context.Background())
		defer cancel2(nil)
		stop2 := stopearly.Requested(ended, ended.ResignRequested(), errAsked, cancel2)
		ended.End(baton.ErrLeaseLost)
		synctest.Wait()
		stop2()
		if ctx2.Err() != nil {
			t.Error("the watch of an ended term cancelled the work")
		}
		stopearly.Requested(ended, nil, errAsked, cancel2)() // nil: nothing to watch
	})
}
