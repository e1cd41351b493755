// Package balancetest is the harness of the balance tests: simulated
// processes that each run a balance.Group over the same leases, and checks
// that every lease is led by exactly one of them, within the balance bound,
// and never by two at once. The balance package's own tests run it on the
// memory backend, the cross-module tests (module integration) on etcd, and
// the benchmarks of bench and bench/kubernetes its measurement (Bench). It
// imports nothing outside the standard library and this module, so that it
// adds nothing to any module's graph.
package balancetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/balance"
	"github.com/batonhq/baton/internal/testkit"
)

// Config is the Group configuration of the tests' processes: group "jobs",
// candidate id, 100 ms refreshes. BATON_TEST_BALANCE_LOG (debug, info,
// warn) sends the Groups' log lines at that level to stderr, to see why a
// run did what it did.
func Config(id string) balance.Config {
	cfg := balance.Config{
		Group:           "jobs",
		Candidate:       baton.Candidate{ID: id},
		RefreshInterval: 100 * time.Millisecond,
		ShedAfter:       time.Second,
		RetryMax:        time.Second,
	}
	if lv := os.Getenv("BATON_TEST_BALANCE_LOG"); lv != "" {
		var level slog.Level
		if err := level.UnmarshalText([]byte(lv)); err == nil {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
		}
	}
	return cfg
}

// Proc is one simulated process: a Group on a Backend of its own.
type Proc struct {
	ID   string             // the Group's candidate id
	G    *balance.Group     // the process's Group
	Kill func()             // stop renewing and talking to the store, as kill -9 would
	Stop context.CancelFunc // cancels Run's context, as a graceful shutdown would
	Done chan error         // receives Run's result
}

// Fence is a downstream store that the leader-only work writes to with its
// term's token, such as the chaos harness's fenced store: the work writes
// once when it starts and once when its context has ended, its last act,
// with the term's safe-until deadline at that moment (a write after it is
// late: the holder was paused, which only the fence can stop). Write
// reports whether the store accepted the write.
type Fence interface {
	Write(lease, candidate string, token uint64, safeUntil time.Time) bool
}

// World is a set of processes running the same leases, with a record of
// which process runs which lease's Func, to catch two running at once.
type World struct {
	T      testing.TB    // the test or benchmark the World belongs to
	Leases []string      // the names the processes run, job-00 on
	Fence  Fence         // when not nil, every Func writes to it
	reader baton.Backend // reads the store, to check that it agrees with the processes

	mu      sync.Mutex
	procs   []*Proc
	running map[string]running // lease → the process whose Func runs
	starts  int                // Funcs started: terms led
	late    int                // Funcs started while another ran past its safe-until
	errs    []string
}

// running is the process whose Func runs a lease, and its term.
type running struct {
	id   string
	term baton.Term
}

// NewWorld returns a World of n leases, job-00 to job-NN, whose holders
// CheckBalanced also reads through reader (nil: not checked).
func NewWorld(t testing.TB, n int, reader baton.Backend) *World {
	w := &World{T: t, running: map[string]running{}, reader: reader}
	for i := range n {
		w.Leases = append(w.Leases, fmt.Sprintf("job-%02d", i))
	}
	return w
}

// Fn is the leader-only work: it marks the lease as run by id until its
// context ends, and writes to the Fence, if any, when it starts and when
// it stops.
func (w *World) Fn(id string) balance.Func {
	return func(ctx context.Context, term baton.Term) error {
		if w.Fence != nil {
			w.Fence.Write(term.Lease(), id, term.Token(), term.SafeUntil())
		}
		w.mu.Lock()
		if other, ok := w.running[term.Lease()]; ok {
			if time.Now().Before(other.term.SafeUntil()) {
				w.errs = append(w.errs, fmt.Sprintf("%s started %s (token %d) while %s still ran it, before its safe-until", id, term.Lease(), term.Token(), other.id))
			} else {
				// The other's work is still running past its term's
				// safe-until: its goroutine has not yet been scheduled to
				// see its context end, as if paused.
				w.late++
			}
		}
		w.running[term.Lease()] = running{id, term}
		w.starts++
		w.mu.Unlock()
		<-ctx.Done()
		w.mu.Lock()
		if w.running[term.Lease()].id == id {
			delete(w.running, term.Lease())
		}
		w.mu.Unlock()
		if w.Fence != nil {
			w.Fence.Write(term.Lease(), id, term.Token(), term.SafeUntil())
		}
		return nil
	}
}

// Starts returns how many Funcs have started so far: every term led, the
// first of each lease included. The difference across a change of the
// group is how many times leases changed hands during it.
func (w *World) Starts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.starts
}

// Holders returns the process leading each lease among live, by their
// Groups' Status; a lease led by none is absent.
func (w *World) Holders(live []*Proc) map[string]string {
	h := map[string]string{}
	for _, p := range live {
		for _, name := range p.G.Status().Leading {
			h[name] = p.ID
		}
	}
	return h
}

// Moved counts the leases held in both snapshots of Holders whose holder
// in after differs from before: the net moves between them. (A lease
// between two terms in a snapshot is not counted.)
func Moved(before, after map[string]string) int {
	n := 0
	for name, id := range after {
		if was, ok := before[name]; ok && was != id {
			n++
		}
	}
	return n
}

// Start adds the World's leases to g and runs g as a process whose kill
// stands for kill -9; the test's cleanup cancels it and checks that Run
// returned context.Canceled.
func (w *World) Start(g *balance.Group, kill func()) *Proc {
	w.T.Helper()
	for _, name := range w.Leases {
		if err := g.Add(name, w.Fn(g.ID())); err != nil {
			w.T.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proc{ID: g.ID(), G: g, Kill: kill, Stop: cancel, Done: make(chan error, 1)}
	go func() { p.Done <- g.Run(ctx) }()
	w.T.Cleanup(func() {
		cancel()
		select {
		case err := <-p.Done:
			if !errors.Is(err, context.Canceled) {
				w.T.Errorf("%s: Run returned %v, want context.Canceled", p.ID, err)
			}
		case <-time.After(20 * time.Second):
			w.T.Errorf("%s: Run did not return after its context was cancelled", p.ID)
		}
	})
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	return p
}

// CheckBalanced reports whether, among live, every lease is led by exactly
// one process, each leads at most maxLoad and at least minLoad, and every
// process counts len(live) members; if not, it says why.
func (w *World) CheckBalanced(live []*Proc, minLoad, maxLoad int) (bool, string) {
	holders := map[string][]string{}
	var loads []string
	ok := true
	for _, p := range live {
		s := p.G.Status()
		for _, name := range s.Leading {
			holders[name] = append(holders[name], p.ID)
		}
		loads = append(loads, fmt.Sprintf("%s=%d(N=%d)", p.ID, len(s.Leading), s.Members))
		if len(s.Leading) > maxLoad || len(s.Leading) < minLoad || s.Members != len(live) {
			ok = false
		}
	}
	var bad []string
	for _, name := range w.Leases {
		if len(holders[name]) != 1 {
			ok = false
			bad = append(bad, fmt.Sprintf("%s:%v", name, holders[name]))
			continue
		}
		if w.reader == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rec, err := w.reader.Leader(ctx, name)
		cancel()
		if err != nil || rec.Holder != holders[name][0] {
			ok = false
			bad = append(bad, fmt.Sprintf("%s: %s leads it but the store says %q (%v)", name, holders[name][0], rec.Holder, err))
		}
	}
	return ok, fmt.Sprintf("loads %s; leases without exactly one holder: %v", strings.Join(loads, " "), bad)
}

// AwaitSteady waits until CheckBalanced has held for a whole second: long
// enough for several refreshes and sheds to have changed it if they would.
// It returns how long it took until the balance began to hold.
func (w *World) AwaitSteady(live []*Proc, minLoad, maxLoad int, timeout time.Duration) time.Duration {
	w.T.Helper()
	return w.AwaitSteadyFor(live, minLoad, maxLoad, time.Second, timeout)
}

// AwaitSteadyFor is AwaitSteady with the time CheckBalanced must hold
// given: a large world needs longer, since each of its refreshes does.
// It polls less often the more leases there are, since each check reads
// every process's Status.
func (w *World) AwaitSteadyFor(live []*Proc, minLoad, maxLoad int, hold, timeout time.Duration) time.Duration {
	w.T.Helper()
	start := time.Now()
	var since time.Time
	var why string
	poll := max(20*time.Millisecond, time.Duration(len(w.Leases)*len(live))*2500*time.Nanosecond)
	steady := testkit.Poll(timeout, poll, func() bool {
		var ok bool
		ok, why = w.CheckBalanced(live, minLoad, maxLoad)
		switch {
		case !ok:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		}
		return ok && time.Since(since) >= hold
	})
	if !steady {
		w.T.Fatalf("not steady within %s (want loads in [%d, %d]): %s%s", timeout, minLoad, maxLoad, why, lastErrors(live, minLoad))
	}
	took := since.Sub(start)
	if len(why) > 2000 {
		why = why[:2000] + "…"
	}
	w.T.Logf("steady after %s: %s", took.Round(10*time.Millisecond), why)
	return took
}

// lastErrors says, for each of live below minLoad, the last errors of up
// to five of its leases (Status.Errors): why a process short of its share
// did not take more.
func lastErrors(live []*Proc, minLoad int) string {
	var b strings.Builder
	for _, p := range live {
		s := p.G.Status()
		if len(s.Leading) >= minLoad || len(s.Errors) == 0 {
			continue
		}
		fmt.Fprintf(&b, "; %s's last errors (%d leases):", p.ID, len(s.Errors))
		for _, name := range slices.Sorted(maps.Keys(s.Errors))[:min(5, len(s.Errors))] {
			fmt.Fprintf(&b, " %s: %v;", name, s.Errors[name])
		}
	}
	return b.String()
}

// CheckNoOverlap fails the test for each time two processes ran one
// lease's Func at once, the first before its term's safe-until. It logs how
// many times the first ran past its safe-until (its goroutine not yet
// scheduled after its context ended: a pause, which fencing covers).
func (w *World) CheckNoOverlap() {
	w.T.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		w.T.Error(e)
	}
	if w.late > 0 {
		w.T.Logf("%d times a Func started while the previous holder's still ran past its safe-until (a pause)", w.late)
	}
}

// MoveSlack is how many hand-overs beyond the fewest needed a leave or a
// join of one instance may cost, with leases over n instances: a lease that
// a view up to a refresh old sends to an instance that turns out to be at
// its share is shed on once more. One per ten instances, and at least two.
func MoveSlack(leases, n int) int { return max(2, n/10) }

// Change is what one change of the group (an instance leaving or joining)
// cost.
type Change struct {
	// Needed is the fewest leases that had to change hands: the leaver's
	// load, or the newcomer's share floor(leases/N).
	Needed int
	// Moved counts the leases whose holder differs after the change (net),
	// HandOvers every term begun during it (a lease that moved twice counts
	// twice).
	Moved, HandOvers int
	// Took is the time from the change until the loads were within the
	// bound again, and stayed there.
	Took time.Duration
}

func (c Change) String() string {
	return fmt.Sprintf("%d needed, %d moved, %d hand-overs, even after %s", c.Needed, c.Moved, c.HandOvers, c.Took.Round(10*time.Millisecond))
}

// LeaveJoin runs the leave-and-join scenario on live, which must be steady:
// the first process leaves gracefully (its Run's context is cancelled, and
// Run must return context.Canceled); once the rest are steady, start starts
// a new process with the id given; and once the group is steady again, it
// returns what each change cost and the processes then live. Steady means
// every lease led by exactly one process and every load in [floor, ceil] of
// its share, for hold.
func (w *World) LeaveJoin(live []*Proc, start func(id string) *Proc, hold, timeout time.Duration) (leave, join Change, after []*Proc) {
	w.T.Helper()
	n, l := len(live), len(w.Leases)

	before, starts := w.Holders(live), w.Starts()
	leaver := live[0]
	leave.Needed = len(leaver.G.Status().Leading)
	t0 := time.Now()
	leaver.Stop()
	select {
	case err := <-leaver.Done:
		if !errors.Is(err, context.Canceled) {
			w.T.Fatalf("%s: Run returned %v, want context.Canceled", leaver.ID, err)
		}
		leaver.Done <- err // for the clean-up
	case <-time.After(timeout):
		w.T.Fatalf("%s: Run did not return within %s of its context's end", leaver.ID, timeout)
	}
	live = slices.Clone(live[1:])
	wait := time.Since(t0)
	leave.Took = wait + w.AwaitSteadyFor(live, l/(n-1), (l+n-2)/(n-1), hold, timeout)
	leave.HandOvers = w.Starts() - starts
	leave.Moved = Moved(before, w.Holders(live))

	before, starts = w.Holders(live), w.Starts()
	t0 = time.Now()
	live = append(live, start(fmt.Sprintf("%s-new", leaver.ID)))
	join.Needed = l / n
	wait = time.Since(t0)
	join.Took = wait + w.AwaitSteadyFor(live, l/n, (l+n-1)/n, hold, timeout)
	join.HandOvers = w.Starts() - starts
	join.Moved = Moved(before, w.Holders(live))
	return leave, join, live
}
