package backend_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
)

// forgetfulStore is a store that can lose every record at once, as Redis
// without persistence does when it restarts: Wipe puts a fresh memory store
// behind it. It does not claim backend.RecordKeeper.
type forgetfulStore struct {
	mu sync.Mutex
	s  *memory.Store
}

func (f *forgetfulStore) Wipe() {
	f.mu.Lock()
	f.s = memory.NewStore()
	f.mu.Unlock()
}

func (f *forgetfulStore) store() *memory.Store {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *forgetfulStore) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	return f.store().Get(ctx, name)
}

func (f *forgetfulStore) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	return f.store().CompareAndSwap(ctx, name, version, rec)
}

// TestTokensRiseAcrossLostRecords: on a store that may lose records, a
// record created afresh starts at an epoch above the lost one's tokens,
// for the process that saw them (whatever its clock) and for a new one
// whose clock reads a later second.
func TestTokensRiseAcrossLostRecords(t *testing.T) {
	f := &forgetfulStore{}
	f.Wipe()
	b := newBackend(t, f, cfg)
	terms := func(b *backend.RecordBackend, n int, after uint64) uint64 {
		t.Helper()
		for range n {
			term, err := b.Campaign(context.Background(), "job", baton.Candidate{ID: "a"})
			if err != nil {
				t.Fatal(err)
			}
			if term.Token() <= after {
				t.Fatalf("token %d is not above %d", term.Token(), after)
			}
			after = term.Token()
			if err := term.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		return after
	}
	last := terms(b, 3, 0)
	if last>>32 == 0 {
		t.Fatalf("token %d of a store that may lose records has no epoch", last)
	}
	f.Wipe()
	last = terms(b, 2, last)
	lastAt := time.Now()

	f.Wipe()
	for backend.EpochOf(time.Now()) <= max(backend.EpochOf(lastAt), last>>32) {
		time.Sleep(20 * time.Millisecond) // the documented assumption: a later second
	}
	terms(newBackend(t, f, cfg), 1, last)

	// The memory store keeps its records: its tokens start at 1.
	m := newBackend(t, memory.NewStore(), cfg)
	if got := terms(m, 1, 0); got != 1 {
		t.Fatalf("memory store's first token = %d, want 1", got)
	}
}
