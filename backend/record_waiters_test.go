package backend_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
)

// readCounter is a process's connection to a memory store that counts the
// reads it makes, as the store's server would.
type readCounter struct {
	*memory.Conn
	gets atomic.Int64
}

func (c *readCounter) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	c.gets.Add(1)
	return c.Conn.Get(ctx, name)
}

// Many candidates of one process waiting for one lease cost the store what
// one does: a release (or a renewal, which wakes waiters too) makes the
// process read the record once or twice, not once per candidate, and
// exactly one of them wins.
func TestWaitersOfOneProcessReadOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const waiters = 50
		store := memory.NewStore()
		cfg := backend.RecordOptions{Config: backend.Config{TTL: 3 * time.Second}}
		holderB, err := backend.NewRecordBackend(store.Connect(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer holderB.Close(context.Background())
		conn := &readCounter{Conn: store.Connect()}
		waitB, err := backend.NewRecordBackend(conn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer waitB.Close(context.Background())

		held, err := holderB.Campaign(context.Background(), "l", baton.Candidate{ID: "holder"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			won []baton.Term
		)
		for i := range waiters {
			wg.Go(func() {
				term, err := waitB.Campaign(ctx, "l", baton.Candidate{ID: fmt.Sprintf("w%d", i)})
				if err != nil {
					return
				}
				mu.Lock()
				won = append(won, term)
				mu.Unlock()
			})
		}
		synctest.Wait()

		// A renewal of the holder's: every waiter that watches wakes.
		before := conn.gets.Load()
		time.Sleep(cfg.Config.TTL / 3)
		synctest.Wait()
		if got := conn.gets.Load() - before; got > 2 {
			t.Errorf("one renewal interval with %d candidates waiting: %d reads by their process, want at most 2", waiters, got)
		}

		before = conn.gets.Load()
		if err := held.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := conn.gets.Load() - before; got > 3 {
			t.Errorf("a release with %d candidates of one process waiting: %d reads by that process, want at most 3", waiters, got)
		}
		mu.Lock()
		if len(won) != 1 {
			t.Errorf("%d candidates won the released lease, want 1", len(won))
		}
		next := won
		mu.Unlock()

		// The others still wait, and one of them takes the lease when the
		// winner gives it up.
		if len(next) == 1 {
			if err := next[0].Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			mu.Lock()
			if len(won) != 2 {
				t.Errorf("after the winner resigned, %d candidates have won in all, want 2", len(won))
			}
			mu.Unlock()
		}
		cancel()
		wg.Wait()
	})
}
