package gocronbaton_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/gocronbaton"
	"github.com/batonhq/baton/internal/testkit"
)

// askingBackend is a memory backend whose terms can be asked to resign from
// outside, as the raft backend's terms are by the agent's resign endpoint.
type askingBackend struct {
	*memory.Backend
	mu    sync.Mutex
	terms []*askingTerm
}

type askingTerm struct {
	baton.Term
	req  chan struct{}
	once sync.Once
}

func (t *askingTerm) ResignRequested() <-chan struct{} { return t.req }

func (b *askingBackend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	t, err := b.Backend.Campaign(ctx, name, c)
	if err != nil {
		return nil, err
	}
	at := &askingTerm{Term: t, req: make(chan struct{})}
	b.mu.Lock()
	b.terms = append(b.terms, at)
	b.mu.Unlock()
	return at, nil
}

// ask requests a resign of every term handed out so far.
func (b *askingBackend) ask() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.terms {
		t.once.Do(func() { close(t.req) })
	}
}

// A resign requested while a job runs releases the lease only after the job
// returned, and not an hour of Hold later; the lease goes to no new run on
// that term meanwhile.
func TestLockerRequestedResignWaitsForTheRun(t *testing.T) {
	store := memory.NewStore()
	b := &askingBackend{Backend: newBackend(t, store)}
	l, err := gocronbaton.NewLocker(b, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: "a"}, Hold: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx := context.Background()
	lk, err := l.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	b.ask()
	// The run still uses the term: the lease stays held.
	time.Sleep(100 * time.Millisecond) // give a wrong release the chance to happen
	if rec, err := b.Leader(ctx, "job"); err != nil || rec.Holder != "a" {
		t.Fatalf("lease while the run still goes on: %v, %v; want held by a", rec, err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyErr(t, 10*time.Second, "the lease released after the run returned, a resign having been requested", func() error {
		rec, err := b.Leader(ctx, "job")
		if errors.Is(err, baton.ErrNoLeader) {
			return nil
		}
		return fmt.Errorf("still held: %v, %v", rec, err)
	})
}
