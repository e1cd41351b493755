package testkit

import (
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton"
)

// HandOversGoToQueueHead checks a store's waiter queue against a Backend's
// own line of candidates: two processes (Backends a and b on one store),
// each with two candidates for lease, one of each waiting in its process
// behind the other (a Backend's candidates take turns). Each of rounds
// resigns must hand the lease to the other process, which heads the
// store's queue, not to the resigner's own next candidate, which needs no
// wake-up and would otherwise take it first: a process with many
// candidates would pass the lease among its own while the others wait.
// Tokens must rise. queued waits until n processes wait in the store's
// queue for lease.
func HandOversGoToQueueHead(t *testing.T, a, b baton.Backend, lease string, rounds int, queued func(n int)) {
	t.Helper()
	ps := []baton.Backend{a, b}
	ctx := t.Context()
	type win struct {
		proc int
		id   string
		term baton.Term
		err  error
	}
	won := make(chan win, 4)
	campaign := func(p int, id string) {
		go func() {
			term, err := ps[p].Campaign(ctx, lease, baton.Candidate{ID: id})
			won <- win{p, id, term, err}
		}()
	}
	next := func(what string) win {
		t.Helper()
		select {
		case w := <-won:
			if w.err != nil {
				t.Fatalf("%s: %v", w.id, w.err)
			}
			return w
		case <-time.After(time.Minute):
			t.Fatalf("no candidate took the lease within a minute (%s)", what)
		}
		return win{}
	}
	campaign(0, "p0-a")
	holder := next("the first")
	campaign(0, "p0-b") // waits in process 0, behind p0-a
	campaign(1, "p1-a")
	queued(1)           // process 1 heads the store's queue
	campaign(1, "p1-b") // waits in process 1, behind p1-a
	for i := range rounds {
		if err := holder.term.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		campaign(holder.proc, holder.id) // at the back of its process's line
		w := next(fmt.Sprintf("hand-over %d", i))
		if w.proc == holder.proc {
			t.Fatalf("hand-over %d: %s, process %d's own next candidate, took the lease from %s while process %d headed the store's queue",
				i, w.id, w.proc, holder.id, 1-holder.proc)
		}
		if w.term.Token() <= holder.term.Token() {
			t.Fatalf("hand-over %d: token %d after %d", i, w.term.Token(), holder.term.Token())
		}
		holder = w
		// The process that lost the lease queues behind the new holder's.
		queued(1)
	}
	if err := holder.term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
