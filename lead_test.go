package baton_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
)

// leadCause runs Lead on term with cfg and a function that waits for its
// context; act runs once the function is running. It returns the cause
// of the function's context and the term's error as the function saw it
// when its context ended.
func leadCause(t *testing.T, term baton.Term, cfg baton.LeadConfig, act func()) (cause, termErr error) {
	t.Helper()
	running := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- baton.Lead(context.Background(), term, cfg, func(ctx context.Context, _ baton.Term) error {
			close(running)
			<-ctx.Done()
			cause, termErr = context.Cause(ctx), term.Err()
			return nil
		})
	}()
	<-running
	act()
	if err := <-done; err != nil {
		t.Fatalf("Lead = %v, want the function's nil", err)
	}
	return cause, termErr
}

// A term that ends cancels the work with its error.
func TestLeadTermEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Hour), nil)
		cause, _ := leadCause(t, term, baton.LeadConfig{StopEarly: time.Second}, func() { term.End(baton.ErrLeaseLost) })
		if !errors.Is(cause, baton.ErrLeaseLost) {
			t.Errorf("cause = %v, want the term's ErrLeaseLost", cause)
		}
	})
}

// Renewals that move safe-until on keep the work going; once they stop,
// the work is cancelled StopEarly before safe-until, with ErrStoppedEarly,
// and logged once.
func TestLeadLaggingRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const early = 2 * time.Second
		term := backend.NewBasicTerm("l", 1, time.Now().Add(10*time.Second), nil)
		var log strings.Builder
		var last time.Time
		var stoppedAt time.Time
		cause, _ := leadCause(t, term, baton.LeadConfig{StopEarly: early, Logger: newTextLogger(&log)}, func() {
			for range 5 {
				time.Sleep(5 * time.Second)
				term.Extend(time.Now().Add(10 * time.Second))
			}
			last = term.SafeUntil()
		})
		stoppedAt = time.Now()
		if got := last.Sub(stoppedAt); got != early {
			t.Errorf("cancelled %s before safe-until, want %s (renewals kept it ahead until then)", got, early)
		}
		if !errors.Is(cause, baton.ErrStoppedEarly) || !strings.Contains(cause.Error(), "safe-until is 2s away, within StopEarly (2s)") {
			t.Errorf("cause = %v, want ErrStoppedEarly naming the distance to safe-until", cause)
		}
		if n := strings.Count(log.String(), "renewals lag"); n != 1 || !strings.Contains(log.String(), "safe_until_in=2s") {
			t.Errorf("log = %q, want one line saying renewals lag, 2s before safe-until", log.String())
		}
	})
}

// Lead waits for the work, then resigns; what happens to the term after
// that does not reach the work's context.
func TestLeadResignsAfterWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var released atomic.Bool
		term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Second), func(context.Context) error {
			released.Store(true)
			return nil
		})
		var fctx context.Context
		err := baton.Lead(context.Background(), term, baton.LeadConfig{}, func(ctx context.Context, _ baton.Term) error {
			fctx = ctx
			if released.Load() || term.Err() != nil {
				t.Error("the lease was released while the work ran")
			}
			return errors.New("work failed")
		})
		if err == nil || err.Error() != "work failed" {
			t.Errorf("Lead = %v, want the work's error", err)
		}
		if !released.Load() || !errors.Is(term.Err(), baton.ErrResigned) {
			t.Errorf("after Lead: released %v, term.Err %v; want released and ErrResigned", released.Load(), term.Err())
		}
		time.Sleep(2 * time.Second) // past the old safe-until
		if cause := context.Cause(fctx); cause != context.Canceled {
			t.Errorf("cause after Lead = %v, want plain context.Canceled: the watch must end with the work", cause)
		}
	})
}

// A requested resign cancels the work with a cause wrapping ErrResigned
// and leaves the term running until the work returned; a term that ended
// first keeps its own cause.
func TestLeadResignRequested(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Hour), nil)
		cause, termErr := leadCause(t, term, baton.LeadConfig{}, func() { term.RequestResign(baton.ErrResigned) })
		if !errors.Is(cause, baton.ErrResigned) || !strings.Contains(cause.Error(), "a resign was requested") {
			t.Errorf("cause = %v, want ErrResigned saying a resign was requested", cause)
		}
		if termErr != nil {
			t.Errorf("the request ended the term before the work returned: %v", termErr)
		}
		if !errors.Is(term.Err(), baton.ErrResigned) {
			t.Errorf("after Lead term.Err = %v, want ErrResigned", term.Err())
		}

		ended := backend.NewBasicTerm("l", 2, time.Now().Add(time.Hour), nil)
		cause, _ = leadCause(t, ended, baton.LeadConfig{}, func() {
			ended.End(baton.ErrLeaseLost)
			synctest.Wait()
			ended.RequestResign(baton.ErrResigned)
		})
		if !errors.Is(cause, baton.ErrLeaseLost) {
			t.Errorf("cause = %v, want the ended term's ErrLeaseLost", cause)
		}
	})
}

// A term won with no more than StopEarly left is resigned without running
// the work.
func TestLeadTooLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Second), nil)
		ran := false
		err := baton.Lead(context.Background(), term, baton.LeadConfig{StopEarly: time.Second}, func(context.Context, baton.Term) error {
			ran = true
			return nil
		})
		if err != nil || ran || !errors.Is(term.Err(), baton.ErrResigned) {
			t.Errorf("Lead = %v, ran %v, term.Err %v; want nil, not run, resigned", err, ran, term.Err())
		}
	})
}

// The back-off doubles from Min to Max, with each wait in [d/2, d], and
// starts again at Min after Reset; its zero value uses the defaults.
func TestBackoff(t *testing.T) {
	check := func(bo *baton.Backoff, want []time.Duration) {
		t.Helper()
		for i, d := range want {
			if got := bo.Next(); got < d/2 || got > d {
				t.Errorf("wait %d = %s, want within [%s, %s]", i, got, d/2, d)
			}
		}
	}
	var zero baton.Backoff
	check(&zero, []time.Duration{baton.DefaultRetryMin, 2 * baton.DefaultRetryMin, 4 * baton.DefaultRetryMin})
	for range 20 {
		zero.Next()
	}
	check(&zero, []time.Duration{baton.DefaultRetryMax, baton.DefaultRetryMax})
	zero.Reset()
	check(&zero, []time.Duration{baton.DefaultRetryMin})

	bo := baton.Backoff{Min: time.Second, Max: 3 * time.Second}
	check(&bo, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second})
	inverted := baton.Backoff{Min: time.Second, Max: time.Millisecond}
	check(&inverted, []time.Duration{time.Second, time.Second})
}

// Campaign retries what a retry may fix, telling failed each time, and
// returns a *ConfigError or ErrClosed at once; failed returning false
// ends it after the wait.
func TestCampaignRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb, err := memory.New(memory.NewStore(), memory.Options{Config: testCfg})
		if err != nil {
			t.Fatal(err)
		}
		defer mb.Close(context.Background())
		unavailable := &refusingBackend{Backend: mb, err: baton.ErrBackendUnavailable}
		var waits []time.Duration
		start := time.Now()
		_, err = baton.Campaign(t.Context(), unavailable, "l", baton.Candidate{ID: "a"}, &baton.Backoff{}, func(err error, wait time.Duration) bool {
			waits = append(waits, wait)
			return len(waits) < 3
		})
		if !errors.Is(err, baton.ErrBackendUnavailable) || unavailable.tries != 3 || len(waits) != 3 {
			t.Fatalf("Campaign = %v after %d tries, %d waits; want ErrBackendUnavailable after 3 of each", err, unavailable.tries, len(waits))
		}
		if took, sum := time.Since(start), waits[0]+waits[1]+waits[2]; took != sum {
			t.Errorf("took %s, want the sum of the waits %s: every failure is waited for, the last too", took, sum)
		}

		for _, fatal := range []error{&baton.ConfigError{Problems: []string{"TTL too low"}}, baton.ErrClosed} {
			b := &refusingBackend{Backend: mb, err: fatal}
			_, err := baton.Campaign(t.Context(), b, "l", baton.Candidate{ID: "a"}, &baton.Backoff{}, func(error, time.Duration) bool {
				t.Errorf("failed called for %v, which no retry fixes", fatal)
				return true
			})
			if !errors.Is(err, fatal) || b.tries != 1 {
				t.Errorf("Campaign = %v after %d tries, want %v after 1", err, b.tries, fatal)
			}
		}

		term, err := baton.Campaign(t.Context(), mb, "l", baton.Candidate{ID: "a"}, &baton.Backoff{}, nil)
		if err != nil || term.Token() == 0 {
			t.Fatalf("Campaign on a working backend = %v, %v", term, err)
		}
		_ = term.Resign(t.Context())
	})
}

// newTextLogger logs to w as text, without times.
func newTextLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
}

// shortTerm is a term whose SafeUntil is earlier than the moment it ends
// itself: a third-party Term that relies on Lead to stop the work by its
// safe-until.
type shortTerm struct {
	baton.Term
	safeUntil time.Time
}

func (t shortTerm) SafeUntil() time.Time { return t.safeUntil }

// A negative StopEarly counts as zero: the work still stops at
// safe-until, never after it.
func TestLeadNegativeStopEarlyStopsBySafeUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		term := shortTerm{backend.NewBasicTerm("l", 1, start.Add(time.Hour), nil), start.Add(time.Second)}
		var stopped time.Time
		err := baton.Lead(context.Background(), term, baton.LeadConfig{StopEarly: -time.Minute}, func(ctx context.Context, _ baton.Term) error {
			<-ctx.Done()
			stopped = time.Now()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := stopped.Sub(start); got != time.Second {
			t.Errorf("the work stopped %s after it began, want at safe-until, 1s", got)
		}
	})
}

// Work stopped at safe-until leaves the term to end with its own reason:
// Lead does not resign a term whose safe-until has passed before the term
// says how it ended (a lock that expired must not read "resigned").
func TestLeadPastSafeUntilKeepsTheTermsReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		term := shortTerm{backend.NewBasicTerm("l", 1, start.Add(time.Second+10*time.Millisecond), nil), start.Add(time.Second)}
		err := baton.Lead(context.Background(), term, baton.LeadConfig{}, func(ctx context.Context, _ baton.Term) error {
			<-ctx.Done()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(term.Err(), baton.ErrExpired) {
			t.Errorf("the term ended with %v, want its own ErrExpired", term.Err())
		}
	})
}

// A nil *Backoff is a zero Backoff: Campaign retries with the default
// waits.
func TestCampaignNilBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb, err := memory.New(memory.NewStore(), memory.Options{Config: testCfg})
		if err != nil {
			t.Fatal(err)
		}
		defer mb.Close(context.Background())
		b := &refusingBackend{Backend: mb, err: baton.ErrBackendUnavailable}
		var waits []time.Duration
		_, err = baton.Campaign(t.Context(), b, "l", baton.Candidate{ID: "a"}, nil, func(_ error, wait time.Duration) bool {
			waits = append(waits, wait)
			return len(waits) < 2
		})
		if !errors.Is(err, baton.ErrBackendUnavailable) || b.tries != 2 {
			t.Fatalf("Campaign = %v after %d tries, want ErrBackendUnavailable after 2", err, b.tries)
		}
		if waits[0] < baton.DefaultRetryMin/2 || waits[0] > baton.DefaultRetryMin {
			t.Errorf("first wait %s, want within [%s, %s]", waits[0], baton.DefaultRetryMin/2, baton.DefaultRetryMin)
		}
	})
}
