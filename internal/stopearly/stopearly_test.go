package stopearly_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/stopearly"
)

var errLag = errors.New("lagging")

// A term that ends cancels with its error.
func TestTermEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		term := baton.NewBasicTerm("l", 1, time.Now().Add(time.Hour), nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		stop := stopearly.Watch(term, time.Second, cancel, func() error { return errLag })
		defer stop()
		term.End(baton.ErrLeaseLost)
		<-ctx.Done()
		if cause := context.Cause(ctx); !errors.Is(cause, baton.ErrLeaseLost) {
			t.Errorf("cause = %v, want the term's ErrLeaseLost", cause)
		}
	})
}

// Renewals that move safe-until on keep the work going; once they stop,
// the work is cancelled early before safe-until, with lagged's error.
func TestLaggingRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const early = 2 * time.Second
		term := baton.NewBasicTerm("l", 1, time.Now().Add(10*time.Second), nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		stop := stopearly.Watch(term, early, cancel, func() error { return errLag })
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
		if cause := context.Cause(ctx); !errors.Is(cause, errLag) {
			t.Errorf("cause = %v, want lagged's error", cause)
		}
	})
}

// After stop, nothing is cancelled.
func TestStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		term := baton.NewBasicTerm("l", 1, time.Now().Add(time.Second), nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		stopearly.Watch(term, 0, cancel, func() error { return errLag })()
		term.End(baton.ErrLeaseLost)
		time.Sleep(2 * time.Second)
		if ctx.Err() != nil {
			t.Errorf("cancelled after stop: %v", context.Cause(ctx))
		}
	})
}
