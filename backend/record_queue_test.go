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

// takeCounter is a process's connection to a memory store that counts the
// compare-and-swaps it sends to take a lease (a record naming a holder
// over one that names none), as the store's server would see them.
type takeCounter struct {
	*memory.Conn
	takes atomic.Int64
}

func (c *takeCounter) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	if rec.Holder != "" {
		if old, v, err := c.Conn.Get(ctx, name); err == nil && v == version && old.Holder == "" {
			c.takes.Add(1)
		}
	}
	return c.Conn.CompareAndSwap(ctx, name, version, rec)
}

// holdLease starts a process on store whose candidate "holder" holds
// lease "l".
func holdLease(t *testing.T, store *memory.Store, opts backend.RecordOptions) (*backend.RecordBackend, baton.Term) {
	t.Helper()
	holder, err := backend.NewRecordBackend(store.Connect(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	term, err := holder.Campaign(context.Background(), "l", baton.Candidate{ID: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	return holder, term
}

// queueProcess is one waiting process of the queue tests: a RecordBackend
// on a connection of its own, and the terms its campaign won.
type queueProcess struct {
	b    *backend.RecordBackend
	conn *takeCounter
	won  chan baton.Term
}

func startWaiters(t *testing.T, ctx context.Context, store *memory.Store, opts backend.RecordOptions, n int) []*queueProcess {
	t.Helper()
	ps := make([]*queueProcess, n)
	for i := range ps {
		conn := &takeCounter{Conn: store.Connect()}
		b, err := backend.NewRecordBackend(conn, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close(context.Background()) })
		p := &queueProcess{b: b, conn: conn, won: make(chan baton.Term, 1)}
		ps[i] = p
		go func() {
			term, err := b.Campaign(ctx, "l", baton.Candidate{ID: fmt.Sprintf("p%d", i)})
			if err == nil {
				p.won <- term
			}
		}()
		// One after the other, so that the queue's order is known.
		synctest.Wait()
	}
	return ps
}

// A release hands the lease to the process that has waited longest, and
// only that process sends a write to take it: the others, told by the
// release whom it is for, send nothing. Five hand-overs among five
// waiting processes go to each in the order they came.
func TestReleaseWakesOneWaitingProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		opts := backend.RecordOptions{Config: backend.Config{TTL: 3 * time.Second}}
		_, term := holdLease(t, store, opts)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ps := startWaiters(t, ctx, store, opts, 5)

		takes := func() (n int64) {
			for _, p := range ps {
				n += p.conn.takes.Load()
			}
			return n
		}
		for i, p := range ps {
			before := takes()
			if err := term.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			select {
			case term = <-p.won:
			default:
				t.Fatalf("hand-over %d: process p%d, which has waited longest, did not get the lease", i, i)
			}
			for j, q := range ps {
				if j != i && len(q.won) > 0 {
					t.Fatalf("hand-over %d: process p%d won too", i, j)
				}
			}
			if n := takes() - before; n != 1 {
				t.Errorf("hand-over %d: the waiting processes sent %d writes to take the lease, want 1 (the head's)", i, n)
			}
		}
	})
}

// goneHead starts a holder of lease "l" and n waiting processes on store,
// and cuts the first of them, the queue's head, off for good: its campaign
// ends unavailable at its next read, and it cannot leave the queue. It
// returns the holder's term and the waiting processes.
func goneHead(t *testing.T, ctx context.Context, store *memory.Store, opts backend.RecordOptions, n int) (baton.Term, []*queueProcess) {
	t.Helper()
	_, term := holdLease(t, store, opts)
	ps := startWaiters(t, ctx, store, opts, n)
	if head, _ := store.QueueHead(ctx, "l", ""); head != ps[0].b.Process() {
		t.Fatalf("queue head %q, want the first waiting process %q", head, ps[0].b.Process())
	}
	ps[0].conn.Disconnect()
	return term, ps
}

// A queue head that is gone when the lease is released to it holds up the
// hand-over for the reservation only: the next process takes the lease
// once the reservation has passed, and takes the gone head off the queue,
// so that the next release goes to a live process at once.
func TestGoneQueueHeadCostsOneReservation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		ttl := 3 * time.Second
		opts := backend.RecordOptions{Config: backend.Config{TTL: ttl}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		term, ps := goneHead(t, ctx, store, opts, 3)

		released := time.Now()
		if err := term.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if len(ps[1].won) != 0 || len(ps[2].won) != 0 {
			t.Fatal("a process took the lease during the gone head's reservation")
		}
		var (
			next       baton.Term
			winner     *queueProcess
			stillWaits *queueProcess
		)
		select {
		case next = <-ps[1].won:
			winner, stillWaits = ps[1], ps[2]
		case next = <-ps[2].won:
			winner, stillWaits = ps[2], ps[1]
		case <-time.After(ttl):
			t.Fatalf("nobody took the lease within a TTL of its release to a gone head")
		}
		reserve := ttl / 10
		if took := time.Since(released); took < reserve || took > reserve+100*time.Millisecond {
			t.Errorf("the next process took the lease %s after the release, want the reservation (%s)", took, reserve)
		}
		synctest.Wait()
		if head, _ := store.QueueHead(ctx, "l", ""); head != stillWaits.b.Process() {
			t.Errorf("queue head after the gone head was passed over: %q, want the process still waiting, %q (the winner: %q)", head, stillWaits.b.Process(), winner.b.Process())
		}

		released = time.Now()
		if err := next.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if len(stillWaits.won) != 1 || time.Since(released) != 0 {
			t.Errorf("the next release did not go to the live head at once")
		}
	})
}

// A process that cannot use the queue (here: its queue calls fail, as
// when its Role does not allow the queue object) still takes the lease
// when it is free: the queue only orders waiters, it never keeps one out.
// And it does not try the queue again at every renewal it sees.
func TestWaitersWithoutQueueStillTakeOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		opts := backend.RecordOptions{Config: backend.Config{TTL: 3 * time.Second}}
		_, term := holdLease(t, store, opts)
		nq := noQueue{Conn: store.Connect(), calls: new(atomic.Int64)}
		b, err := backend.NewRecordBackend(nq, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(context.Background())
		var (
			wg  sync.WaitGroup
			got baton.Term
		)
		wg.Go(func() { got, _ = b.Campaign(context.Background(), "l", baton.Candidate{ID: "w"}) })
		synctest.Wait()
		// Six renewals of the holder's, each seen by the waiter.
		time.Sleep(2 * opts.Config.TTL)
		synctest.Wait()
		if n := nq.calls.Load(); n != 1 {
			t.Errorf("the waiter whose queue calls fail made %d of them over six renewals, want 1", n)
		}
		if err := term.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if got == nil {
			t.Fatal("the waiter whose queue calls fail did not take the released lease")
		}
	})
}

// noQueue is a connection whose queue calls all fail; calls counts them.
type noQueue struct {
	*memory.Conn
	calls *atomic.Int64
}

func (q noQueue) JoinQueue(context.Context, string, string) error {
	q.calls.Add(1)
	return fmt.Errorf("queue refused")
}
func (q noQueue) LeaveQueue(context.Context, string, string) error {
	q.calls.Add(1)
	return fmt.Errorf("queue refused")
}
func (q noQueue) QueueHead(context.Context, string, string) (string, error) {
	q.calls.Add(1)
	return "", fmt.Errorf("queue refused")
}
func (q noQueue) DropQueueHead(context.Context, string, string) error {
	q.calls.Add(1)
	return fmt.Errorf("queue refused")
}

// A holder that crashed while more of its candidates waited leaves its
// process in the queue; whoever takes the lease over from it (a TTL after
// its last renewal) takes that process out, so that no later release is
// handed to it and held up for a reservation.
func TestCrashedHolderLeavesTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		ttl := 3 * time.Second
		opts := backend.RecordOptions{Config: backend.Config{TTL: ttl}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		crashConn := store.Connect()
		crashed, err := backend.NewRecordBackend(crashConn, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer crashed.Close(context.Background())
		if _, err := crashed.Campaign(ctx, "l", baton.Candidate{ID: "c0"}); err != nil {
			t.Fatal(err)
		}
		// A second candidate of the holder's process waits: the process
		// queues for the lease.
		go crashed.Campaign(ctx, "l", baton.Candidate{ID: "c1"})
		synctest.Wait()
		ps := startWaiters(t, ctx, store, opts, 2)
		if head, _ := store.QueueHead(ctx, "l", ""); head != crashed.Process() {
			t.Fatalf("queue head %q, want the holder's process %q, whose second candidate waits", head, crashed.Process())
		}
		crashConn.Disconnect()

		var next baton.Term
		select {
		case next = <-ps[0].won:
		case next = <-ps[1].won:
		case <-time.After(3 * ttl):
			t.Fatal("nobody took over from the crashed holder")
		}
		synctest.Wait()
		released := time.Now()
		if err := next.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ps[0].won:
		case <-ps[1].won:
		case <-time.After(ttl):
			t.Fatal("nobody took the released lease")
		}
		if took := time.Since(released); took != 0 {
			t.Errorf("the release after the takeover went to the waiting process %s later, want at once: the crashed process stayed in the queue and was handed the lease", took)
		}
	})
}

// A release never names the releasing process itself, though it may still
// be at the queue's head (its move to the tail or its leaving, which
// follow its win in the background, not yet done): the lease goes to the
// next waiting process at once, not after a reservation.
func TestReleaseSkipsTheReleasingProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		opts := backend.RecordOptions{Config: backend.Config{TTL: 3 * time.Second}}
		holder, term := holdLease(t, store, opts)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ps := startWaiters(t, ctx, store, opts, 1)
		// The holder's process heads the queue, as right after it won.
		if err := store.JoinQueue(context.Background(), "l", holder.Process()); err != nil {
			t.Fatal(err)
		}
		if err := store.JoinQueue(context.Background(), "l", ps[0].b.Process()); err != nil {
			t.Fatal(err)
		}
		if head, _ := store.QueueHead(ctx, "l", ""); head != holder.Process() {
			t.Fatalf("queue head %q, want the holder's process", head)
		}
		released := time.Now()
		if err := term.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ps[0].won:
		case <-time.After(time.Minute):
			t.Fatal("the waiting process did not take the released lease")
		}
		if took := time.Since(released); took != 0 {
			t.Errorf("the waiting process took the lease %s after the release, want at once: the release named the releasing process", took)
		}
	})
}

// A lease released to a queue head that is gone is taken after one
// reservation also by campaigns each shorter than the reservation, tried
// one after another by one process (as balance tries a member slot at
// every refresh, each try bounded by half a refresh): the reservation is
// counted from when the process first saw the release, not from when each
// campaign did.
func TestShortCampaignsOutlastOneReservation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		ttl := 3 * time.Second
		opts := backend.RecordOptions{Config: backend.Config{TTL: ttl}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		term, _ := goneHead(t, ctx, store, opts, 1)
		if err := term.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		p, err := backend.NewRecordBackend(store.Connect(), opts)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(context.Background())
		reserve := ttl / 10
		start := time.Now()
		for try := 1; ; try++ {
			cctx, ccancel := context.WithTimeout(ctx, reserve/4)
			got, err := p.Campaign(cctx, "l", baton.Candidate{ID: "p"})
			ccancel()
			if err == nil {
				t.Logf("won at try %d, %s after the release", try, time.Since(start))
				_ = got.Resign(context.Background())
				break
			}
			if time.Since(start) > ttl {
				t.Fatalf("campaigns of %s each, one after another, did not take a lease released to a gone head within a TTL (%d tries); want it after the reservation, %s", reserve/4, try, reserve)
			}
			time.Sleep(reserve / 8) // the next refresh
		}
	})
}
