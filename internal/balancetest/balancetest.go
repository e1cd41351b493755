// Package balancetest is the harness of the balance tests: simulated
// processes that each run a balance.Group over the same leases, and checks
// that every lease is led by exactly one of them, within the balance bound,
// and never by two at once. The balance package's own tests run it on the
// memory backend, the cross-module tests (module integration) on etcd. It
// imports nothing outside the standard library and this module, so that it
// adds nothing to any module's graph.
package balancetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/balance"
	"github.com/batonhq/baton/internal/testkit"
)

func Config(id string) balance.Config {
	return balance.Config{
		Group:           "jobs",
		Candidate:       baton.Candidate{ID: id},
		RefreshInterval: 100 * time.Millisecond,
		ShedAfter:       time.Second,
		RetryMax:        time.Second,
	}
}

// Proc is one simulated process: a Group on a Backend of its own.
type Proc struct {
	ID   string             // the Group's candidate id
	G    *balance.Group     // the process's Group
	Kill func()             // stop renewing and talking to the store, as kill -9 would
	Stop context.CancelFunc // cancels Run's context, as a graceful shutdown would
	Done chan error         // receives Run's result
}

// World is a set of processes running the same leases, with a record of
// which process runs which lease's Func, to catch two running at once.
type World struct {
	T      *testing.T    // the test the World belongs to
	Leases []string      // the names the processes run, job-00 on
	reader baton.Backend // reads the store, to check that it agrees with the processes

	mu      sync.Mutex
	procs   []*Proc
	running map[string]string // lease → id of the process whose Func runs
	errs    []string
}

// NewWorld returns a World of n leases, job-00 to job-NN, whose holders
// CheckBalanced also reads through reader (nil: not checked).
func NewWorld(t *testing.T, n int, reader baton.Backend) *World {
	w := &World{T: t, running: map[string]string{}, reader: reader}
	for i := range n {
		w.Leases = append(w.Leases, fmt.Sprintf("job-%02d", i))
	}
	return w
}

// Fn is the leader-only work: it marks the lease as run by id until its
// context ends.
func (w *World) Fn(id string) balance.Func {
	return func(ctx context.Context, term baton.Term) error {
		w.mu.Lock()
		if other, ok := w.running[term.Lease()]; ok {
			w.errs = append(w.errs, fmt.Sprintf("%s started %s (token %d) while %s still ran it", id, term.Lease(), term.Token(), other))
		}
		w.running[term.Lease()] = id
		w.mu.Unlock()
		<-ctx.Done()
		w.mu.Lock()
		if w.running[term.Lease()] == id {
			delete(w.running, term.Lease())
		}
		w.mu.Unlock()
		return nil
	}
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

// AwaitSteady waits until checkBalanced has held for a whole second: long
// enough for several refreshes and sheds to have changed it if they would.
func (w *World) AwaitSteady(live []*Proc, minLoad, maxLoad int, timeout time.Duration) {
	w.T.Helper()
	start := time.Now()
	var since time.Time
	var why string
	steady := testkit.Poll(timeout, 20*time.Millisecond, func() bool {
		var ok bool
		ok, why = w.CheckBalanced(live, minLoad, maxLoad)
		switch {
		case !ok:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		}
		return ok && time.Since(since) >= time.Second
	})
	if !steady {
		w.T.Fatalf("not steady within %s (want loads in [%d, %d]): %s", timeout, minLoad, maxLoad, why)
	}
	w.T.Logf("steady after %s: %s", since.Sub(start).Round(10*time.Millisecond), why)
}

// CheckNoOverlap fails the test for each time two processes ran one
// lease's Func at once.
func (w *World) CheckNoOverlap() {
	w.T.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		w.T.Error(e)
	}
}
