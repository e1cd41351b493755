package check

import (
	"sort"
	"time"
)

// gap is a leaderless interval; ended reports that an accepted write ended
// it (not the end of the run).
type gap struct {
	Interval
	ended bool
}

// availability measures leadership over the run and what each fault did to
// it.
func (x *history) availability() (Availability, []FaultRecovery) {
	tol := GapTolerance(x.heartbeat)
	av := Availability{GapTolerance: tol}
	if len(x.acceptedAt) == 0 {
		return av, x.unmeasured()
	}
	span := Interval{x.acceptedAt[0], x.duration}
	av.Span, av.Startup = span, span.Start

	// The leader is active for tol after each accepted write.
	var active []Interval
	for _, at := range x.acceptedAt {
		iv := Interval{at, at + tol}
		if n := len(active); n > 0 && iv.Start <= active[n-1].End {
			active[n-1].End = iv.End
			continue
		}
		active = append(active, iv)
	}
	active = clip(active, span)
	var gaps []gap
	for _, iv := range subtract([]Interval{span}, active) {
		// A gap ends at an accepted write unless the run ended first.
		gaps = append(gaps, gap{iv, iv.End < span.End || x.acceptedAt[len(x.acceptedAt)-1] == iv.End})
	}

	budget := x.run.RecoveryBudget
	recs := make([]FaultRecovery, 0, len(x.faults))
	windows := make([]Interval, 0, len(x.faults))
	for _, f := range x.faults {
		fr := FaultRecovery{ID: f.ID, Kind: f.Kind, Target: f.Target, Start: f.Start, End: f.End}
		// A gap is the fault's doing if it began between the injection and
		// a TTL after the heal: a term the fault ended ends by its
		// safe-until, at most a TTL after its last renewal. Gaps that
		// begin later are another fault's, or none's (and then count
		// against availability). The window may run on past the heal by
		// up to the recovery budget, while such a gap lasts.
		limit := f.End + budget
		horizon := f.End + x.run.TTL
		lo := sort.Search(len(gaps), func(i int) bool { return gaps[i].Start >= f.Start })
		hi := sort.Search(len(gaps), func(i int) bool { return gaps[i].Start > horizon })
		// A gap already under way when the fault began is not its doing,
		// but if it still lasts when the fault heals (a backend restarted
		// while nobody led), the time to recover from there is the
		// fault's too.
		if lo > 0 && gaps[lo-1].End > f.End {
			lo--
		}
		end := f.End
		if lo < hi {
			last := gaps[hi-1]
			fr.Interrupted = true
			for _, g := range gaps[lo:hi] {
				fr.Leaderless += g.Len()
			}
			fr.Recovery = last.End - f.Start
			fr.Recovered = last.ended
			end = max(end, min(last.End, limit))
		}
		x.handOver(&fr, limit)
		fr.Window = Interval{f.Start, end}
		windows = append(windows, fr.Window)
		recs = append(recs, fr)
	}
	// Faults are sorted by Start, so their windows are too.
	inside := clip(union(windows), span)
	outside := subtract([]Interval{span}, inside)
	av.Inside, av.Outside = total(inside), total(outside)
	av.ActiveOutside = total(intersect(active, outside))
	av.Fraction = 1
	if av.Outside > 0 {
		av.Fraction = float64(av.ActiveOutside) / float64(av.Outside)
	}
	av.Overall = 1
	if span.Len() > 0 {
		av.Overall = float64(total(active)) / float64(span.Len())
	}
	for _, iv := range subtract(subtract([]Interval{span}, active), inside) {
		av.Leaderless++
		av.LeaderlessTime += iv.Len()
		if iv.Len() > av.Longest.Len() {
			av.Longest = iv
		}
		if len(av.Examples) < MaxExamples {
			av.Examples = append(av.Examples, iv)
		}
	}
	return av, recs
}

// handOver sets fr's From, To and HandOver: the term leading when the
// fault began (its last accepted write at most GapTolerance before), and
// the first other term to have a write accepted after that, by limit; the
// hand-over is the time between the last write of the one and the first of
// the other. A graceful hand-over leaves no gap, and is measured all the
// same.
func (x *history) handOver(fr *FaultRecovery, limit time.Duration) {
	tol := GapTolerance(x.heartbeat)
	i := sort.Search(len(x.acceptedAt), func(i int) bool { return x.acceptedAt[i] > fr.Start }) - 1
	if i < 0 || x.acceptedAt[i] < fr.Start-tol {
		return // nobody led when the fault began
	}
	from := x.acceptedTerm[i]
	for j := i + 1; j < len(x.acceptedAt) && x.acceptedAt[j] <= limit; j++ {
		if x.acceptedTerm[j] != from {
			fr.From, fr.To = from.ref, x.acceptedTerm[j].ref
			fr.HandOver = x.acceptedAt[j] - x.acceptedAt[j-1]
			return
		}
	}
	fr.From = from.ref
}

// unmeasured lists the faults of a run without a leader: nothing recovered.
func (x *history) unmeasured() []FaultRecovery {
	recs := make([]FaultRecovery, 0, len(x.faults))
	for _, f := range x.faults {
		recs = append(recs, FaultRecovery{ID: f.ID, Kind: f.Kind, Target: f.Target, Start: f.Start, End: f.End,
			Window: Interval{f.Start, f.End}})
	}
	return recs
}

// termAt returns the term of the accepted write at time at (the last one,
// if several share it).
func (x *history) termAt(at time.Duration) TermRef {
	i := sort.Search(len(x.acceptedAt), func(i int) bool { return x.acceptedAt[i] > at }) - 1
	if i < 0 {
		return TermRef{}
	}
	return x.acceptedTerm[i].ref
}

// byKind summarises fault recoveries per kind.
func byKind(recs []FaultRecovery) map[string]KindRecovery {
	type acc struct {
		k                        KindRecovery
		rec, leaderless, handOff []time.Duration
	}
	m := map[string]*acc{}
	for _, fr := range recs {
		a := m[fr.Kind]
		if a == nil {
			a = &acc{}
			m[fr.Kind] = a
		}
		a.k.Faults++
		if fr.HandOver > 0 {
			a.k.HandedOver++
			a.handOff = append(a.handOff, fr.HandOver)
		}
		if !fr.Interrupted {
			continue
		}
		a.k.Interrupted++
		a.rec = append(a.rec, fr.Recovery)
		a.leaderless = append(a.leaderless, fr.Leaderless)
		if !fr.Recovered {
			a.k.Unrecovered++
		}
	}
	out := make(map[string]KindRecovery, len(m))
	for kind, a := range m {
		a.k.Recovery, a.k.Leaderless, a.k.HandOver = dist(a.rec), dist(a.leaderless), dist(a.handOff)
		out[kind] = a.k
	}
	return out
}
