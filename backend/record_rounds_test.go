package backend_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
)

// swapLog is a RecordStore that notes when each lease's record is
// compare-and-swapped.
type swapLog struct {
	backend.RecordStore
	mu    sync.Mutex
	swaps map[string][]time.Time
}

func (s *swapLog) CompareAndSwap(ctx context.Context, name string, v uint64, r backend.LeaseRecord) (uint64, error) {
	s.mu.Lock()
	s.swaps[name] = append(s.swaps[name], time.Now())
	s.mu.Unlock()
	return s.RecordStore.CompareAndSwap(ctx, name, v, r)
}

func (s *swapLog) times(name string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.swaps[name]...)
}

// TestRecordRenewalsInRounds: a RecordBackend renews all its terms in one
// round per RenewInterval, not each on a timer of its own: a lease won half
// an interval after another is renewed at the same instants as the first,
// once per interval. (In a synctest bubble, so instants are exact.)
func TestRecordRenewalsInRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &swapLog{RecordStore: memory.NewStore().Connect(), swaps: map[string][]time.Time{}}
		cfg := backend.Config{TTL: 3 * time.Second} // renew interval 1 s
		b, err := backend.NewRecordBackend(store, backend.RecordOptions{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		ta, err := b.Campaign(ctx, "a", baton.Candidate{ID: "x"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		tb, err := b.Campaign(ctx, "b", baton.Candidate{ID: "x"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if ta.Err() != nil || tb.Err() != nil {
			t.Fatalf("terms ended: %v, %v", ta.Err(), tb.Err())
		}
		a, bs := store.times("a")[1:], store.times("b")[1:] // after the acquisitions
		if len(bs) < 9 || len(bs) > 11 {
			t.Errorf("lease b was written %d times in 9.5 s at a renew interval of 1 s: %v", len(bs), bs)
		}
		at := map[time.Time]bool{}
		for _, x := range a {
			at[x] = true
		}
		for _, x := range bs {
			if !at[x] {
				t.Errorf("lease b renewed at %v, when lease a was not: its own timer, not the round (a at %v)", x, a)
				break
			}
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
