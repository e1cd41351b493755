package baton_test

import (
	"context"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
)

// Two instances campaign for one lease; the first leads, does its work and
// steps down; the second takes over with a higher fencing token.
func ExampleElector_Run() {
	store := memory.NewStore() // in production: etcd.New(client, ...) and so on
	ctx := context.Background()
	for _, id := range []string{"web-1", "web-2"} {
		b, _ := memory.New(store, memory.Options{})
		defer b.Close(ctx)
		e, _ := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report", Candidate: baton.Candidate{ID: id}})
		err := e.Run(ctx, func(ctx context.Context, t baton.Term) error {
			// Leader-only work goes here. Send t.Token() with every write, and
			// stop when ctx is cancelled.
			fmt.Printf("%s leads with token %d\n", id, t.Token())
			return fmt.Errorf("%s finished", id) // a non-nil error ends Run after resigning
		})
		fmt.Println(err)
	}
	// Output:
	// web-1 leads with token 1
	// web-1 finished
	// web-2 leads with token 2
	// web-2 finished
}

// Await blocks until the instance leads, like Curator's LeaderLatch.await.
func ExampleElector_Await() {
	b, _ := memory.New(memory.NewStore(), memory.Options{})
	defer b.Close(context.Background())
	e, _ := baton.NewElector(b, baton.ElectorConfig{Lease: "singleton", Candidate: baton.Candidate{ID: "worker-1"}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- e.Run(ctx, func(ctx context.Context, _ baton.Term) error {
			<-ctx.Done()
			return nil
		})
	}()
	t, _ := e.Await(ctx)
	fmt.Println("leader:", e.Status().Leader, "token:", t.Token())
	cancel()
	<-done
	fmt.Println("leader:", e.Status().Leader)
	// Output:
	// leader: true token: 1
	// leader: false
}

// A program that holds terms itself, one per shard, runs each with the
// same step as the Elector: Campaign with back-off, then Lead, which stops
// the work when the term ends and releases the lease after it returned.
func ExampleLead() {
	b, _ := memory.New(memory.NewStore(), memory.Options{})
	defer b.Close(context.Background())
	ctx := context.Background()
	me := baton.Candidate{ID: "worker-1"}
	for _, shard := range []string{"shard-a", "shard-b"} {
		var bo baton.Backoff // zero: baton.DefaultRetryMin up to baton.DefaultRetryMax
		t, err := baton.Campaign(ctx, b, shard, me, &bo, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		err = baton.Lead(ctx, t, baton.LeadConfig{}, func(ctx context.Context, t baton.Term) error {
			fmt.Printf("%s: token %d\n", t.Lease(), t.Token())
			return nil
		})
		fmt.Println(t.Lease(), "released:", err == nil && t.Err() != nil)
	}
	// Output:
	// shard-a: token 1
	// shard-a released: true
	// shard-b: token 1
	// shard-b released: true
}
