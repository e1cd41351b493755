package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// saturatedRate is the requests per second saturatedMemoryTarget's store
// serves unless BATON_BENCH_STORE_RATE says otherwise.
const saturatedRate = 30000

// saturatedMemoryTarget is the memory backend behind a store that serves a
// fixed number of requests a second, first come first served, as a
// saturated server does: a request waits its turn, and one whose turn
// would come after its context's deadline fails at the deadline. 100
// balance instances refreshing every second read about 20,000 member and
// load slots a second; at 30,000 a second the store is as saturated as
// etcd and ZooKeeper are on this machine at 100 × 10,000, and shows the
// same shape within minutes, in one process, with no server.
// BATON_BENCH_STORE_RATE sets the rate.
func saturatedMemoryTarget(b *testing.B) target {
	rate := saturatedRate
	if s := os.Getenv("BATON_BENCH_STORE_RATE"); s != "" {
		r, err := strconv.Atoi(s)
		if err != nil || r <= 0 {
			b.Fatalf("BATON_BENCH_STORE_RATE=%q: want a positive number of requests a second", s)
		}
		rate = r
	}
	turns := &turnstile{every: time.Second / time.Duration(rate)}
	return memoryTargetWith("memory-saturated", func(c countingStore) backend.RecordStore {
		return saturatedStore{c, turns}
	})
}

// turnstile hands out turns, one every every, in the order asked.
type turnstile struct {
	mu    sync.Mutex
	next  time.Time
	every time.Duration
}

// wait waits for a turn; it fails with baton.ErrBackendUnavailable at
// ctx's deadline when the turn would come after it.
func (t *turnstile) wait(ctx context.Context) error {
	t.mu.Lock()
	now := time.Now()
	at := now
	if t.next.After(at) {
		at = t.next
	}
	if dl, ok := ctx.Deadline(); ok && at.After(dl) {
		t.mu.Unlock()
		<-ctx.Done()
		return fmt.Errorf("%w: the saturated store did not answer in time", baton.ErrBackendUnavailable)
	}
	t.next = at.Add(t.every)
	t.mu.Unlock()
	timer := time.NewTimer(at.Sub(now))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", baton.ErrBackendUnavailable, ctx.Err())
	}
}

// saturatedStore is a countingStore whose requests wait their turn.
type saturatedStore struct {
	countingStore
	turns *turnstile
}

func (s saturatedStore) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	if err := s.turns.wait(ctx); err != nil {
		return backend.LeaseRecord{}, 0, err
	}
	return s.countingStore.Get(ctx, name)
}

// GetMany waits one turn: the turnstile serves requests, and a read of
// many leases is one.
func (s saturatedStore) GetMany(ctx context.Context, names []string) ([]backend.LeaseRecord, []uint64, error) {
	if err := s.turns.wait(ctx); err != nil {
		return nil, nil, err
	}
	return s.countingStore.GetMany(ctx, names)
}

func (s saturatedStore) CompareAndSwap(ctx context.Context, name string, v uint64, r backend.LeaseRecord) (uint64, error) {
	if err := s.turns.wait(ctx); err != nil {
		return 0, err
	}
	return s.countingStore.CompareAndSwap(ctx, name, v, r)
}

// TestTurnstile: turns come one every interval, in the order asked, and a
// request whose turn would come after its deadline fails with
// baton.ErrBackendUnavailable (what a saturated store's client sees).
func TestTurnstile(t *testing.T) {
	turns := &turnstile{every: 20 * time.Millisecond}
	start := time.Now()
	for range 5 {
		if err := turns.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 80*time.Millisecond {
		t.Fatalf("5 turns at one per 20 ms took %s; want at least 80 ms", took)
	}
	for range 10 {
		go func() { _ = turns.wait(context.Background()) }() // a queue of 200 ms
	}
	testkit.Eventually(t, 5*time.Second, "the queue to build", func() bool {
		turns.mu.Lock()
		defer turns.mu.Unlock()
		return time.Until(turns.next) > 100*time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := turns.wait(ctx); !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Fatalf("a request whose turn comes after its deadline: %v; want ErrBackendUnavailable", err)
	}
}
