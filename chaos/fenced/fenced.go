// Package fenced is the chaos harness's fenced store and checker for many
// leases written to from one process, such as the leader-only work of every
// lease of a balance.Group: one fenced store (package store's, the one a
// chaos run's children write to) per lease, written in-process, and the
// chaos checker (package check's) run over each lease's history.
//
// What a passing Result means, for every lease: the store accepted no write
// whose token was below one it had accepted before (fencing held), the
// terms' tokens rose strictly in the order of their first accepted writes,
// and no two terms' work was active at once, where a term's work is active
// from its first write to its last. So work that writes once when it starts
// and once when it has stopped (its context ended) shows every instant at
// which two holders of one lease acted: a lease held twice.
//
// A Leases is safe for concurrent use.
package fenced

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/chaos/internal/check"
	"github.com/batonhq/baton/chaos/internal/record"
	"github.com/batonhq/baton/chaos/internal/store"
)

// MaxExamples bounds Result.Examples.
const MaxExamples = 10

// Leases is a fenced store per lease name, created on its first write.
type Leases struct {
	start time.Time
	pid   int

	mu     sync.Mutex
	leases map[string]*lease
	errs   []string
}

// lease is one lease's store, the sequence numbers of its writers, and
// the late writes as faults.
type lease struct {
	store  *store.Store
	seq    map[check.TermRef]int64
	faults []record.Fault
}

// New returns an empty Leases whose clock starts now.
func New() *Leases {
	return &Leases{start: time.Now(), pid: os.Getpid(), leases: map[string]*lease{}}
}

// Write records a write of candidate's term of lease, with the term's
// fencing token and its safe-until deadline at the time of the write, and
// reports whether the lease's store accepted it: it refuses a token lower
// than the highest it has accepted. A write after safeUntil is late: the
// work ran on past its deadline without noticing, as a paused process
// does; the check counts an overlap it causes as paused (Result.Late), not
// as a lease held twice, since no lease can stop a paused holder, only the
// fence can (and refuses its writes once a successor wrote).
func (l *Leases) Write(name, candidate string, token uint64, safeUntil time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.leases[name]
	if ls == nil {
		ls = &lease{store: store.New(func() time.Duration { return time.Since(l.start) }), seq: map[check.TermRef]int64{}}
		l.leases[name] = ls
	}
	if now := time.Now(); now.After(safeUntil) {
		ls.faults = append(ls.faults, record.Fault{
			ID: len(ls.faults) + 1, Kind: "late", Target: candidate, Paused: true,
			Start: safeUntil.Sub(l.start), End: now.Sub(l.start),
			Note: "the work wrote after its term's safe-until",
		})
	}
	ref := check.TermRef{Candidate: candidate, Token: token}
	ls.seq[ref]++
	// Under l.mu, so that the order of the store's receive times is the
	// order of the writes.
	ok, err := ls.store.Write(candidate, token, l.pid, ls.seq[ref])
	if err != nil {
		l.errs = append(l.errs, fmt.Sprintf("lease %s: %v", name, err))
	}
	return ok
}

// Result sums the checks of every lease's history.
type Result struct {
	// Leases counts the leases written to; Writes, Refused and Terms count
	// the writes, the refused ones (stale tokens), and the terms.
	Leases, Writes, Refused, Terms int
	// Violations counts accepted writes with a token below one accepted
	// before; Regressions, terms whose token was not above their
	// predecessor's; Overlaps, instants two terms' work was active at once.
	// Each must be 0.
	Violations, Regressions, Overlaps int
	// Late counts overlaps caused by work that wrote after its term's
	// safe-until (see Write): a pause, which fencing covers.
	Late int
	// Examples describes the first problems, by lease.
	Examples []string
}

// OK reports whether no lease was ever held twice, by every measure.
func (r Result) OK() bool {
	return r.Violations == 0 && r.Regressions == 0 && r.Overlaps == 0 && len(r.Examples) == 0
}

// String summarises r in one line.
func (r Result) String() string {
	s := fmt.Sprintf("%d leases, %d terms, %d writes (%d refused): %d fencing violations, %d token regressions, %d overlaps (and %d by work past its safe-until)",
		r.Leases, r.Terms, r.Writes, r.Refused, r.Violations, r.Regressions, r.Overlaps, r.Late)
	if len(r.Examples) > 0 {
		s += "; " + strings.Join(r.Examples, "; ")
	}
	return s
}

// Summary runs Check and returns its one-line summary, the times a lease
// was held twice (fencing violations, token regressions and overlaps) and
// the overlaps by work past its safe-until, which the fence refused: the
// checker a benchmark of balance.Group reports with.
func (l *Leases) Summary() (summary string, heldTwice, late int) {
	r := l.Check()
	return r.String(), r.Violations + r.Regressions + r.Overlaps, r.Late
}

// Check runs the chaos checker over every lease's history.
func (l *Leases) Check() Result {
	l.mu.Lock()
	names := make([]string, 0, len(l.leases))
	for name := range l.leases {
		names = append(names, name)
	}
	r := Result{Leases: len(names)}
	for _, e := range l.errs {
		if len(r.Examples) < MaxExamples {
			r.Examples = append(r.Examples, e)
		}
	}
	l.mu.Unlock()
	sort.Strings(names)
	for _, name := range names {
		l.mu.Lock()
		writes := l.leases[name].store.Writes()
		faults := slices.Clone(l.leases[name].faults)
		l.mu.Unlock()
		rep := check.Check(record.History{Run: record.Run{Backend: name}, Writes: writes, Faults: faults})
		r.Writes += rep.Writes
		r.Refused += rep.Refused
		r.Terms += rep.Terms
		r.Violations += rep.Fencing.Violations + rep.Fencing.WronglyRefused
		r.Regressions += rep.Tokens.Regressions
		r.Overlaps += rep.Overlaps.Unexplained
		r.Late += rep.Overlaps.Paused
		if len(r.Examples) >= MaxExamples {
			continue
		}
		for _, v := range rep.Fencing.Examples {
			r.Examples = append(r.Examples, fmt.Sprintf("%s: %s's token %d accepted after %s's %d", name, v.Write.Candidate, v.Write.Token, v.Highest.Candidate, v.Highest.Token))
		}
		for _, g := range rep.Tokens.Examples {
			r.Examples = append(r.Examples, fmt.Sprintf("%s: %s", name, g.Reason))
		}
		for _, o := range rep.Overlaps.Examples {
			if o.PausedBy == 0 {
				r.Examples = append(r.Examples, fmt.Sprintf("%s: %s (token %d) and %s (token %d) both active for %s", name, o.Stale.Candidate, o.Stale.Token, o.Newer.Candidate, o.Newer.Token, o.Len()))
			}
		}
		r.Examples = r.Examples[:min(len(r.Examples), MaxExamples)]
	}
	return r
}
