package gocronbaton_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/gocronbaton"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
)

// Two instances run the same gocron scheduler; only the one that holds the
// lease "cron" runs the jobs. Wrapping the job with Job gives it the term's
// fencing token, and a context that ends if the term does.
func ExampleElector() {
	store := memory.NewStore() // in production: etcd.New(client, ...) and so on
	ran := make(chan string, 10)
	for _, id := range []string{"web-1", "web-2"} {
		b, _ := memory.New(store, memory.Options{})
		defer b.Close(context.Background())
		e, _ := baton.NewElector(b, baton.ElectorConfig{Lease: "cron", Candidate: baton.Candidate{ID: id}})
		el, _ := gocronbaton.NewElector(e, gocronbaton.ElectorOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = el.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		for id == "web-1" && el.IsLeader(ctx) != nil {
			time.Sleep(time.Millisecond) // let web-1 lead, for a predictable output
		}

		s, _ := gocron.NewScheduler(gocron.WithDistributedElector(el))
		defer func() { _ = s.Shutdown() }()
		_, _ = s.NewJob(gocron.DurationJob(time.Hour),
			gocron.NewTask(el.Job(func(ctx context.Context, t baton.Term) error {
				// Leader-only work: send t.Token() with every write, stop
				// when ctx ends.
				ran <- fmt.Sprintf("%s ran the report with token %d", id, t.Token())
				return nil
			})),
			gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartImmediately()))
		s.Start()
	}
	fmt.Println(<-ran)
	// Output:
	// web-1 ran the report with token 1
}

// Two instances run the same job at the same instant; the Locker lets one of
// them run it and makes the other skip.
func ExampleLocker() {
	store := memory.NewStore()
	var (
		mu      sync.Mutex
		runs    int
		skips   int
		settled = make(chan struct{})
	)
	count := func(skip bool) {
		mu.Lock()
		defer mu.Unlock()
		if skip {
			skips++
		} else {
			runs++
		}
		if runs+skips == 2 {
			close(settled)
		}
	}
	at := time.Now().Add(200 * time.Millisecond) // both fire at this instant
	for _, id := range []string{"web-1", "web-2"} {
		b, _ := memory.New(store, memory.Options{})
		defer b.Close(context.Background())
		l, _ := gocronbaton.NewLocker(b, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: id}})
		defer l.Close(context.Background()) // after the scheduler's Shutdown: defers run in reverse

		s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(l))
		defer func() { _ = s.Shutdown() }()
		_, _ = s.NewJob(gocron.DurationJob(time.Hour),
			gocron.NewTask(func() { count(false) }), // the job itself is unchanged
			gocron.WithName("nightly-backup"),
			gocron.WithStartAt(gocron.WithStartDateTime(at)),
			gocron.WithEventListeners(gocron.AfterLockError(func(uuid.UUID, string, error) { count(true) })))
		s.Start()
	}
	<-settled
	fmt.Printf("ran %d time, skipped %d time\n", runs, skips)
	// Output:
	// ran 1 time, skipped 1 time
}
