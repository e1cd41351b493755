package gocronbaton_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/gocronbaton"
)

// failingBackend is a memory backend whose campaigns fail with err; it
// records when each was tried.
type failingBackend struct {
	*memory.Backend
	err error

	mu    sync.Mutex
	tries []time.Time
}

func (b *failingBackend) Campaign(context.Context, string, baton.Candidate) (baton.Term, error) {
	b.mu.Lock()
	b.tries = append(b.tries, time.Now())
	b.mu.Unlock()
	return nil, b.err
}

func (b *failingBackend) attempts() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.tries...)
}

func newFailingLocker(t *testing.T, err error) (*gocronbaton.Locker, *failingBackend) {
	t.Helper()
	mb, merr := memory.New(memory.NewStore(), memory.Options{Config: testTiming})
	if merr != nil {
		t.Fatal(merr)
	}
	t.Cleanup(func() { _ = mb.Close(context.Background()) })
	b := &failingBackend{Backend: mb, err: err}
	l, lerr := gocronbaton.NewLocker(b, gocronbaton.LockerOptions{})
	if lerr != nil {
		t.Fatal(lerr)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, b
}

// The Locker backs off between failed campaigns as the Elector does: up
// to baton.DefaultRetryMax (10 s), so that instances waiting out a long
// outage do not hammer the backend every 5 s.
func TestLockerBackOffReachesDefaultRetryMax(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, b := newFailingLocker(t, fmt.Errorf("dial: %w", baton.ErrBackendUnavailable))
		// Locks keep coming, as a scheduler's would, so that the
		// campaign goes on.
		for len(b.attempts()) < 16 {
			if _, err := l.Lock(t.Context(), "job"); err == nil {
				t.Fatal("Lock succeeded on a backend that refuses every campaign")
			}
		}
		tries := b.attempts()
		// By the 10th attempt the back-off has doubled from 100 ms past
		// 10 s: every wait is then in [5 s, 10 s].
		longest := time.Duration(0)
		for i := 11; i < 16; i++ {
			gap := tries[i].Sub(tries[i-1])
			if gap < baton.DefaultRetryMax/2 || gap > baton.DefaultRetryMax {
				t.Errorf("wait before attempt %d = %s, want within [%s, %s]", i, gap, baton.DefaultRetryMax/2, baton.DefaultRetryMax)
			}
			longest = max(longest, gap)
		}
		if longest <= 5*time.Second {
			t.Errorf("the longest of 5 waits at the top of the back-off is %s; want above 5 s (the cap is baton.DefaultRetryMax)", longest)
		}
	})
}

// A campaign refused with a *baton.ConfigError is not retried: no retry
// fixes the configuration. The Lock that asked, and every later one, fail
// with it, and the Locker campaigns no more for the key.
func TestLockerStopsOnConfigError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refused := fmt.Errorf("create session: %w", &baton.ConfigError{Problems: []string{"session TTL below the minimum"}})
		l, b := newFailingLocker(t, refused)
		for i := range 3 {
			_, err := l.Lock(t.Context(), "job")
			var ce *baton.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Lock %d = %v, want the campaign's ConfigError", i, err)
			}
			time.Sleep(time.Minute) // whatever back-off there is, over
		}
		if n := len(b.attempts()); n != 1 {
			t.Errorf("%d campaigns; want 1: a configuration error is not retried", n)
		}
	})
}
