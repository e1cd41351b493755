package check

import (
	"math"
	"slices"
	"time"
)

// union merges intervals sorted by Start into disjoint ones (touching
// intervals merge too).
func union(in []Interval) []Interval {
	var out []Interval
	for _, iv := range in {
		if n := len(out); n > 0 && iv.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, iv.End)
			continue
		}
		out = append(out, iv)
	}
	return out
}

// total sums the lengths of disjoint intervals.
func total(in []Interval) time.Duration {
	var t time.Duration
	for _, iv := range in {
		t += iv.Len()
	}
	return t
}

// intersect returns the intersection of two sorted disjoint interval lists.
func intersect(a, b []Interval) []Interval {
	var out []Interval
	for i, j := 0, 0; i < len(a) && j < len(b); {
		s, e := max(a[i].Start, b[j].Start), min(a[i].End, b[j].End)
		if s < e {
			out = append(out, Interval{s, e})
		}
		if a[i].End < b[j].End {
			i++
		} else {
			j++
		}
	}
	return out
}

// subtract returns a minus b, both sorted and disjoint.
func subtract(a, b []Interval) []Interval {
	var out []Interval
	j := 0
	for _, iv := range a {
		cur := iv
		for j < len(b) && b[j].End <= cur.Start {
			j++
		}
		for k := j; k < len(b) && b[k].Start < cur.End; k++ {
			if b[k].Start > cur.Start {
				out = append(out, Interval{cur.Start, b[k].Start})
			}
			cur.Start = max(cur.Start, b[k].End)
			if cur.Start >= cur.End {
				break
			}
		}
		if cur.Start < cur.End {
			out = append(out, cur)
		}
	}
	return out
}

// clip cuts sorted disjoint intervals to span.
func clip(in []Interval, span Interval) []Interval {
	return intersect(in, []Interval{span})
}

// dist computes the distribution of ds (nearest-rank percentiles).
func dist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Dist{
		N:    len(s),
		P50:  rank(0.50),
		P90:  rank(0.90),
		P99:  rank(0.99),
		Max:  s[len(s)-1],
		Mean: sum / time.Duration(len(s)),
	}
}
