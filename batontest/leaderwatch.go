package batontest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// LeaderWatch checks a backend that implements baton.LeaderWatcher: a
// process that only watches lease NAME hears who holds it each time that
// changes (nobody, a first holder, the next one after a resign, nobody
// once that one resigns, a new holder, nobody once that one is killed and
// its session expires, without a read of its own in between; or, with
// Target.KeepsKilledHolder, the killed one until its successor), and
// WatchLeader returns ctx's error when ctx ends and ErrClosed once the
// watching Backend is closed.
func LeaderWatch(t *testing.T, target Target) {
	cfg := backend.Config{TTL: max(time.Second, target.MinTTL)}
	w, a, b, c := target.New(t, cfg), target.New(t, cfg), target.New(t, cfg), target.New(t, cfg)
	lw, ok := w.Backend.(baton.LeaderWatcher)
	if !ok {
		t.Fatalf("%T does not implement baton.LeaderWatcher", w.Backend)
	}
	lease := leaseName(t)
	got := make(chan string, 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- lw.WatchLeader(ctx, lease, func(rec baton.Record, err error) {
			switch {
			case errors.Is(err, baton.ErrNoLeader):
				got <- "nobody"
			case err != nil:
				got <- "error: " + err.Error()
			case rec.Lease != lease:
				got <- fmt.Sprintf("a record of lease %q", rec.Lease)
			default:
				got <- rec.Holder
			}
		})
	}()
	last := ""
	// next waits for the watch to say want, after any of pass.
	next := func(want string, pass ...string) {
		t.Helper()
		timeout := time.After(3*cfg.TTL + 20*time.Second)
		for {
			select {
			case g := <-got:
				if g == last {
					continue // an unchanged answer may come again
				}
				last = g
				if slices.Contains(pass, g) {
					continue
				}
				if g != want {
					t.Fatalf("the watch said %q, want %q", g, want)
				}
				return
			case err := <-done:
				t.Fatalf("WatchLeader returned %v while waiting for %q", err, want)
			case <-timeout:
				t.Fatalf("the watch did not say %q (last: %q)", want, last)
			}
		}
	}
	next("nobody")
	ta := testkit.CampaignWithin(t, a.Backend, lease, "a", 10*time.Second)
	next("a")
	bWon := make(chan baton.Term, 1)
	go func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		tb, err := b.Backend.Campaign(cctx, lease, baton.Candidate{ID: "b"})
		if err != nil {
			t.Errorf("campaign b: %v", err)
		}
		bWon <- tb
	}()
	// b may or may not be queued by now: the watch may say nobody
	// leads between a's resign and b's win.
	resign(t, ta)
	next("b", "nobody")
	tb := <-bWon
	if tb == nil {
		t.FailNow()
	}
	resign(t, tb)
	next("nobody")
	testkit.CampaignWithin(t, c.Backend, lease, "c", 10*time.Second)
	next("c")
	c.Kill()
	if target.KeepsKilledHolder {
		testkit.CampaignWithin(t, a.Backend, lease, "d", 3*cfg.TTL+20*time.Second)
		next("d")
	} else {
		next("nobody")
	}

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("after ctx ended, WatchLeader returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchLeader did not return after ctx ended")
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	done2 := make(chan error, 1)
	started := make(chan struct{}, 1)
	go func() {
		done2 <- lw.WatchLeader(ctx2, lease, func(baton.Record, error) {
			select {
			case started <- struct{}{}:
			default:
			}
		})
	}()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("a second watch said nothing")
	}
	closer, ok := w.Backend.(interface{ Close(context.Context) error })
	if !ok {
		t.Fatalf("%T has no Close(context.Context) error", w.Backend)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	_ = closer.Close(cctx)
	select {
	case err := <-done2:
		if !errors.Is(err, baton.ErrClosed) {
			t.Errorf("after Close, WatchLeader returned %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchLeader did not return after the Backend was closed")
	}
}
