package check

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/batonhq/baton/chaos/internal/record"
)

// DefaultHeartbeat stands for the run's Heartbeat when the history gives
// none.
const DefaultHeartbeat = 20 * time.Millisecond

// GapTolerance is how long after an accepted write the leader still counts
// as active: 5 heartbeats, so that a few lost or late writes are not an
// outage.
func GapTolerance(heartbeat time.Duration) time.Duration { return 5 * heartbeat }

// PauseSlack is how long after a paused fault ends an overlap may still
// begin and be explained by it: two heartbeats for the resumed child's next
// write, plus 100 ms for the scheduler of a machine that just resumed a
// process tree.
func PauseSlack(heartbeat time.Duration) time.Duration {
	return 2*heartbeat + 100*time.Millisecond
}

// child is what the writes show of one child.
type child struct {
	ref         ChildRef
	term        *term
	first, last time.Duration
	// acceptedAt are the times of its accepted writes, in order.
	acceptedAt []time.Duration
}

// term is what the writes show of one term.
type term struct {
	ref           TermRef
	firstWrite    time.Duration
	firstAccepted time.Duration
	hasAccepted   bool
	// highestAtFirst is the highest accepted term when this term first
	// wrote.
	highestAtFirst TermRef
	// reused is set when a later child of this term began after a higher
	// token than its own was accepted: the token was granted again.
	reused   bool
	reusedAt time.Duration
	reusedBy TermRef
}

// history is a history indexed for the checks.
type history struct {
	run       record.Run
	heartbeat time.Duration
	duration  time.Duration
	writes    []record.Write // by At
	faults    []record.Fault // by Start
	children  []*child       // by first write
	terms     []*term        // by first write
	// acceptedAt and acceptedTerm list the accepted writes, in order.
	acceptedAt   []time.Duration
	acceptedTerm []*term
}

// Check checks a history and returns its report. It does not modify h.
// Writes need not be sorted: Check orders them by At, keeping the order of
// equal times.
func Check(h record.History) Report {
	x := index(h)
	r := Report{
		Backend:        h.Run.Backend,
		Seed:           h.Run.Seed,
		Command:        h.Run.Command,
		Broken:         h.Run.Broken,
		Started:        h.Run.Started,
		Duration:       x.duration,
		Heartbeat:      x.heartbeat,
		TTL:            h.Run.TTL,
		RecoveryBudget: h.Run.RecoveryBudget,
		Candidates:     h.Run.Candidates,
		Writes:         len(x.writes),
		Accepted:       len(x.acceptedAt),
		Refused:        len(x.writes) - len(x.acceptedAt),
		Children:       len(x.children),
		Terms:          len(x.terms),
		Faults:         len(x.faults),
		FaultsByKind:   map[string]int{},
		Exits:          slices.Clone(h.Exits),
	}
	for _, f := range x.faults {
		r.FaultsByKind[f.Kind]++
	}
	r.Fencing = x.fencing()
	r.Tokens = x.tokens()
	r.Overlaps = x.overlaps()
	r.Availability, r.FaultRecovery = x.availability()
	r.Recovery = byKind(r.FaultRecovery)
	return r
}

// index sorts the history and gathers its children and terms.
func index(h record.History) *history {
	x := &history{run: h.Run, heartbeat: h.Run.Heartbeat, duration: h.Run.Duration}
	if x.heartbeat <= 0 {
		x.heartbeat = DefaultHeartbeat
	}
	x.writes = h.Writes
	if !slices.IsSortedFunc(x.writes, func(a, b record.Write) int { return cmp.Compare(a.At, b.At) }) {
		x.writes = slices.Clone(h.Writes)
		slices.SortStableFunc(x.writes, func(a, b record.Write) int { return cmp.Compare(a.At, b.At) })
	}
	x.faults = slices.Clone(h.Faults)
	slices.SortStableFunc(x.faults, func(a, b record.Fault) int { return cmp.Compare(a.Start, b.Start) })
	if n := len(x.writes); n > 0 {
		x.duration = max(x.duration, x.writes[n-1].At)
	}

	type ckey struct {
		cand  string
		pid   int
		token uint64
	}
	children := map[ckey]*child{}
	terms := map[TermRef]*term{}
	var highest *term
	for _, w := range x.writes {
		tref := TermRef{w.Candidate, w.Token}
		t := terms[tref]
		if t == nil {
			t = &term{ref: tref, firstWrite: w.At}
			if highest != nil {
				t.highestAtFirst = highest.ref
			}
			terms[tref] = t
			x.terms = append(x.terms, t)
		}
		k := ckey{w.Candidate, w.PID, w.Token}
		c := children[k]
		if c == nil {
			if t.firstWrite != w.At && highest != nil && highest != t && highest.ref.Token > w.Token && !t.reused {
				t.reused, t.reusedAt, t.reusedBy = true, w.At, highest.ref
			}
			c = &child{ref: ChildRef{w.Candidate, w.Token, w.PID}, term: t, first: w.At}
			children[k] = c
			x.children = append(x.children, c)
		}
		c.last = w.At
		if w.Accepted {
			c.acceptedAt = append(c.acceptedAt, w.At)
			if !t.hasAccepted {
				t.hasAccepted, t.firstAccepted = true, w.At
			}
			x.acceptedAt = append(x.acceptedAt, w.At)
			x.acceptedTerm = append(x.acceptedTerm, t)
			if highest == nil || w.Token > highest.ref.Token {
				highest = t
			}
		}
	}
	return x
}

// fencing replays the store's rule over the writes.
func (x *history) fencing() Fencing {
	f := Fencing{StaleRefusedBy: map[string]int{}}
	var highest TermRef
	seen := false
	for _, w := range x.writes {
		switch {
		case w.Accepted && seen && w.Token < highest.Token:
			f.Violations++
			if len(f.Examples) < MaxExamples {
				f.Examples = append(f.Examples, Violation{At: w.At, Write: ChildRef{w.Candidate, w.Token, w.PID}, Highest: highest})
			}
		case w.Accepted:
			if !seen || w.Token > highest.Token {
				highest = TermRef{w.Candidate, w.Token}
			}
			seen = true
		default:
			f.StaleRefused++
			f.StaleRefusedBy[w.Candidate]++
			if !seen || w.Token >= highest.Token {
				f.WronglyRefused++
			}
		}
	}
	return f
}

// tokens checks that each term's token is above its predecessor's.
func (x *history) tokens() Tokens {
	var tk Tokens
	add := func(g Regression) {
		tk.Regressions++
		if len(tk.Examples) < MaxExamples {
			tk.Examples = append(tk.Examples, g)
		}
	}
	var acc []*term
	for _, t := range x.terms {
		if t.reused {
			add(Regression{At: t.reusedAt, Term: t.ref, Previous: t.reusedBy,
				Reason: fmt.Sprintf("token %d granted to %s again after token %d was accepted", t.ref.Token, t.ref.Candidate, t.reusedBy.Token)})
		}
		if t.hasAccepted {
			acc = append(acc, t)
			continue
		}
		tk.NeverAccepted++
		if f, ok := x.faultOn(t.ref.Candidate, t.firstWrite, false); ok && (f.Paused || f.Kind == "stop-baton" || f.Kind == "stall") {
			tk.Delayed++
			continue
		}
		add(Regression{At: t.firstWrite, Term: t.ref, Previous: t.highestAtFirst,
			Reason: fmt.Sprintf("every write refused: the term began after token %d of %s was accepted, and no fault on %s delayed it",
				t.highestAtFirst.Token, t.highestAtFirst.Candidate, t.ref.Candidate)})
	}
	slices.SortStableFunc(acc, func(a, b *term) int { return cmp.Compare(a.firstAccepted, b.firstAccepted) })
	tk.Accepted = len(acc)
	for i := 1; i < len(acc); i++ {
		prev, t := acc[i-1], acc[i]
		if t.ref.Token <= prev.ref.Token {
			add(Regression{At: t.firstAccepted, Term: t.ref, Previous: prev.ref,
				Reason: fmt.Sprintf("token %d not above the previous term's %d", t.ref.Token, prev.ref.Token)})
		}
	}
	return tk
}

// ProcessOf returns the harness's name for the process of candidate, the
// name faults on it are recorded under: the candidate itself ("c2"), or,
// in a run with several candidates per process (--turns), the part before
// the dash ("c2" of "c2-3").
func ProcessOf(candidate string) string {
	p, _, _ := strings.Cut(candidate, "-")
	return p
}

// faultOn returns the first fault targeting candidate whose window [Start,
// End+PauseSlack] contains at; with paused, only faults with Paused set.
func (x *history) faultOn(candidate string, at time.Duration, paused bool) (record.Fault, bool) {
	slack := PauseSlack(x.heartbeat)
	for _, f := range x.faults {
		if f.Start > at {
			break
		}
		if f.Target == ProcessOf(candidate) && (f.Paused || !paused) && at <= f.End+slack {
			return f, true
		}
	}
	return record.Fault{}, false
}

// overlaps counts the overlaps and keeps the first examples.
func (x *history) overlaps() Overlaps {
	var ov Overlaps
	var unexplained, paused []Overlap
	x.eachOverlap(func(o Overlap) {
		if o.PausedBy != 0 {
			ov.Paused++
			ov.PausedTime += o.Len()
			if len(paused) < MaxExamples {
				paused = append(paused, o)
			}
			return
		}
		ov.Unexplained++
		ov.UnexplainedTime += o.Len()
		if len(unexplained) < MaxExamples {
			unexplained = append(unexplained, o)
		}
	})
	ov.Examples = append(unexplained, paused...)
	return ov
}

// eachOverlap calls fn for every pair of children of different terms
// whose activities intersect, in the order the later child began.
func (x *history) eachOverlap(fn func(Overlap)) {
	var active []*child
	for _, c := range x.children {
		// Drop children that ended before c began.
		kept := active[:0]
		for _, a := range active {
			if a.last >= c.first {
				kept = append(kept, a)
			}
		}
		active = kept
		for _, a := range active {
			if a.term == c.term {
				continue
			}
			o := Overlap{Interval: Interval{c.first, min(a.last, c.last)}}
			stale, newer := a, c
			if c.ref.Token < a.ref.Token {
				stale, newer = c, a
			}
			o.Stale, o.Newer = stale.ref, newer.ref
			o.StaleAccepted = countIn(stale.acceptedAt, o.Interval)
			// Only the paused child itself (the stale one, alive before the
			// pause) is excused, and only up to End+slack.
			slack := PauseSlack(x.heartbeat)
			for _, f := range x.faults {
				if f.Start > o.Start {
					break
				}
				if f.Paused && f.Target == ProcessOf(stale.ref.Candidate) &&
					o.Start <= f.End+slack && o.End <= f.End+slack {
					o.PausedBy = f.ID
					break
				}
			}
			fn(o)
		}
		active = append(active, c)
	}
}

// countIn counts the times in sorted ts that fall within (iv.Start,
// iv.End]: after the overlap began.
func countIn(ts []time.Duration, iv Interval) int {
	lo := sort.Search(len(ts), func(i int) bool { return ts[i] > iv.Start })
	hi := sort.Search(len(ts), func(i int) bool { return ts[i] > iv.End })
	return hi - lo
}
