package baton_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
)

// TestWatchLeaderPollsOtherBackends: on a Backend that is not a
// baton.LeaderWatcher (memory), Elector.WatchLeader asks at once, then
// every LeaderPollInterval while its Elector does not lead, and returns
// ctx's error when ctx ends.
func TestWatchLeaderPollsOtherBackends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		w, wb := newElector(t, store, "w")
		if _, ok := any(wb).(baton.LeaderWatcher); ok {
			t.Fatal("the memory Backend is a LeaderWatcher: this test needs one that is not")
		}
		_, ab := newElector(t, store, "a")
		type answer struct {
			holder string
			at     time.Time
		}
		got := make(chan answer, 16)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			done <- w.WatchLeader(ctx, func(rec baton.Record, err error) {
				if errors.Is(err, baton.ErrNoLeader) {
					rec.Holder = "nobody"
				} else if err != nil {
					rec.Holder = "error: " + err.Error()
				}
				got <- answer{rec.Holder, time.Now()}
			})
		}()
		synctest.Wait()
		if a := <-got; a.holder != "nobody" || a.at != start {
			t.Fatalf("first answer %q after %s; want nobody at once", a.holder, a.at.Sub(start))
		}
		if _, err := ab.Campaign(ctx, "job", baton.Candidate{ID: "a"}); err != nil {
			t.Fatal(err)
		}
		if a := <-got; a.holder != "a" || a.at.Sub(start) != baton.LeaderPollInterval {
			t.Fatalf("second answer %q after %s; want a after %s", a.holder, a.at.Sub(start), baton.LeaderPollInterval)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchLeader returned %v after ctx ended, want context.Canceled", err)
		}
	})
}
