package fenced_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/balance"
	"github.com/batonhq/baton/chaos/fenced"
	"github.com/batonhq/baton/internal/balancetest"
)

// The checks can fail: work of two terms of one lease active at once is an
// overlap, and a write with a stale token is refused; work that takes
// turns on another lease is not reported.
func TestDoubleHoldingIsReported(t *testing.T) {
	later := time.Now().Add(time.Hour)
	l := fenced.New()
	// Lease a: b takes over (token 2) while a (token 1) still works, and
	// a writes once more, late.
	l.Write("a", "p1", 1, later)
	l.Write("a", "p2", 2, later)
	if l.Write("a", "p1", 1, later) {
		t.Error("a write with token 1 after token 2 was accepted")
	}
	l.Write("a", "p2", 2, later)
	// Lease b: clean turns.
	for tok, who := range []string{"p1", "p2", "p1"} {
		l.Write("b", who, uint64(tok+1), later)
		l.Write("b", who, uint64(tok+1), later)
	}
	r := l.Check()
	if r.Overlaps != 1 || r.Refused != 1 || r.OK() {
		t.Fatalf("check: %v; want exactly one overlap and one refused write, on lease a", r)
	}
	if r.Leases != 2 || r.Terms != 5 {
		t.Errorf("check: %v; want 2 leases and 5 terms", r)
	}

	// Lease c: the first holder writes once more after its safe-until
	// (paused), after its successor began: late, not held twice.
	past := time.Now()
	l.Write("c", "p1", 1, later)
	l.Write("c", "p2", 2, later)
	l.Write("c", "p1", 1, past)
	r = l.Check()
	if r.Overlaps != 1 || r.Late != 1 {
		t.Errorf("check: %v; want the overlap on lease a, and one late on c", r)
	}

	clean := fenced.New()
	clean.Write("b", "p1", 1, later)
	clean.Write("b", "p1", 1, later)
	clean.Write("b", "p2", 2, later)
	if r := clean.Check(); !r.OK() {
		t.Errorf("clean turns: %v", r)
	}
}

// balance's leave and join on the memory backend, every lease's work
// writing to its fenced store: the spread is even again after each change,
// the leases that change hands are the fewest needed plus
// balancetest.MoveSlack, and the fenced check finds no lease held twice.
func TestBalanceLeaveJoin(t *testing.T) {
	const n, leases = 10, 100
	// Sessions of 5 s: what is counted is the moves that balancing makes,
	// and on a loaded machine 1 s sessions lapse and move all of their
	// process's leases.
	timing := backend.Config{TTL: 5 * time.Second, RenewInterval: 500 * time.Millisecond, DriftMargin: time.Second}
	store := memory.NewStore()
	fence := fenced.New()
	w := balancetest.NewWorld(t, leases, nil)
	w.Fence = fence
	start := func(id string) *balancetest.Proc {
		b, err := memory.New(store, memory.Options{Config: timing})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = b.Close(ctx)
		})
		g, err := balance.New(b, balancetest.Config(id))
		if err != nil {
			t.Fatal(err)
		}
		return w.Start(g, b.Disconnect)
	}
	var procs []*balancetest.Proc
	for i := range n {
		procs = append(procs, start(fmt.Sprintf("p%d", i)))
	}
	w.AwaitSteady(procs, leases/n, leases/n, 60*time.Second)
	leave, join, live := w.LeaveJoin(procs, start, time.Second, 60*time.Second)
	for what, c := range map[string]balancetest.Change{"leave": leave, "join": join} {
		t.Logf("%s: %v", what, c)
		if limit := c.Needed + balancetest.MoveSlack(leases, n); c.HandOvers > limit {
			t.Errorf("%s: %d hand-overs, want at most %d (the %d needed plus the slack)", what, c.HandOvers, limit, c.Needed)
		}
	}
	// Stop every process, so that every term's work has written its last.
	for _, p := range live {
		p.Stop()
		err := <-p.Done
		p.Done <- err // for the clean-up
	}
	r := fence.Check()
	t.Logf("fenced check: %v", r)
	if !r.OK() {
		t.Errorf("a lease was held twice: %v", r)
	}
	if r.Leases != leases || r.Terms < leases+leave.HandOvers+join.HandOvers {
		t.Errorf("fenced check saw %d leases and %d terms; want %d and at least %d", r.Leases, r.Terms, leases, leases+leave.HandOvers+join.HandOvers)
	}
	w.CheckNoOverlap()
}
