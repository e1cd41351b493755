package redis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// queued waits until n processes wait in lease's queue.
func queued(t *testing.T, srv *testserver.Redis, lease string, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d processes queued for %s", n, lease), func() bool {
		got, _ := srv.MustDo(t, "ZCARD", redis.KeysOf("", lease).Queue).(int64)
		return int(got) == n
	})
}

// TestQueueHeadGoneWakesNext: the process at the head of the queue is
// gone (its connections closed, as when it is killed); a release wakes
// the next one at once.
func TestQueueHeadGoneWakesNext(t *testing.T) {
	srv := startQueueServer(t)
	const lease = "gone"
	a, head, next := newQueueProcess(t, srv, queueTiming), newQueueProcess(t, srv, queueTiming), newQueueProcess(t, srv, queueTiming)
	ctx := t.Context()
	holder, err := a.b.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan campaignResult, 2)
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	go func() {
		term, err := head.b.Campaign(hctx, lease, baton.Candidate{ID: "head"})
		results <- campaignResult{1, term, err}
	}()
	queued(t, srv, lease, 1)
	go func() {
		term, err := next.b.Campaign(ctx, lease, baton.Candidate{ID: "next"})
		results <- campaignResult{2, term, err}
	}()
	queued(t, srv, lease, 2)
	subscribers := func() int {
		chans, _ := srv.MustDo(t, "PUBSUB", "CHANNELS", redis.WakeChannel("", "*")).([]any)
		return len(chans)
	}
	if got := subscribers(); got != 3 {
		t.Fatalf("%d process channels subscribed, want 3", got)
	}
	head.proxy.Cut() // the head's connections close, as a killed process's do
	testkit.Eventually(t, 30*time.Second, "the head's process channel unsubscribed", func() bool { return subscribers() == 2 })
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(time.Minute)
	for {
		select {
		case r := <-results:
			if r.who == 1 && r.err != nil {
				continue // the cut-off head gave up: it is gone
			}
			if r.err != nil || r.who != 2 {
				t.Fatalf("want next to take the lease, got p%d: %v", r.who, r.err)
			}
			if err := r.term.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			return
		case <-deadline:
			t.Fatal("the next process did not take the released lease within a minute: the release woke the gone head only")
		}
	}
}

// TestLostWakeUpPolls: the head of the queue is woken but does not act
// (its link stalls, as a paused process's would): the next process still
// takes the lease, by polling.
func TestLostWakeUpPolls(t *testing.T) {
	srv := startQueueServer(t)
	const lease = "lost"
	fast := queueTiming
	fast.PollInterval = 200 * time.Millisecond
	a, head, next := newQueueProcess(t, srv, queueTiming), newQueueProcess(t, srv, queueTiming), newQueueProcess(t, srv, fast)
	ctx := t.Context()
	holder, err := a.b.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan campaignResult, 2)
	go func() {
		term, err := head.b.Campaign(ctx, lease, baton.Candidate{ID: "head"})
		results <- campaignResult{1, term, err}
	}()
	queued(t, srv, lease, 1)
	go func() {
		term, err := next.b.Campaign(ctx, lease, baton.Candidate{ID: "next"})
		results <- campaignResult{2, term, err}
	}()
	queued(t, srv, lease, 2)
	head.proxy.SetLatency(time.Hour) // the head hears nothing more, and says nothing
	t.Cleanup(head.proxy.Cut)        // before its Backend's Close: that one need not wait an hour
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-results:
		if r.err != nil || r.who != 2 {
			t.Fatalf("want next to take the lease, got p%d: %v", r.who, r.err)
		}
		holder = r.term
	case <-time.After(time.Minute):
		t.Fatal("the next process did not take the lease within a minute of its release although it polls every 200ms")
	}
	if holder.Token() == 0 {
		t.Fatal("no token")
	}
}

// TestHandOverGoesToQueueHead: two processes, each with two candidates
// for one lease, one of each waiting in the process behind the other (a
// Backend's candidates take turns). A holder's resign hands the lease to
// the process that heads the store's queue, not to the resigner's own next
// candidate, which then queues at the back: otherwise a process with many
// candidates passes the lease among its own while the others wait.
func TestHandOverGoesToQueueHead(t *testing.T) {
	srv := startQueueServer(t)
	const lease = "turns"
	a, b := newQueueProcess(t, srv, queueTiming), newQueueProcess(t, srv, queueTiming)
	testkit.HandOversGoToQueueHead(t, a.b, b.b, lease, 6, func(n int) { queued(t, srv, lease, n) })
}
