package check

import (
	"cmp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/chaos/internal/record"
)

const ms = time.Millisecond

// builder makes synthetic histories: children write every heartbeat, and
// the store's rule decides what is accepted, as the real store would.
type builder struct {
	run    record.Run
	writes []record.Write
	faults []record.Fault
	seq    map[int]int64
}

func newBuilder() *builder {
	return &builder{
		run: record.Run{Backend: "test", Seed: 7, Command: "baton-chaos --seed 7", Candidates: 3,
			TTL: time.Second, Heartbeat: 20 * ms, RecoveryBudget: 2 * time.Second},
		seq: map[int]int64{},
	}
}

// child adds writes by cand's child pid with token every heartbeat over
// [from, to].
func (b *builder) child(cand string, pid int, token uint64, from, to time.Duration) *builder {
	for at := from; at <= to; at += b.run.Heartbeat {
		b.write(cand, pid, token, at)
	}
	return b
}

func (b *builder) write(cand string, pid int, token uint64, at time.Duration) *builder {
	b.seq[pid]++
	b.writes = append(b.writes, record.Write{At: at, Candidate: cand, Token: token, PID: pid, Seq: b.seq[pid]})
	return b
}

func (b *builder) fault(kind, target string, start, end time.Duration, paused bool) *builder {
	b.faults = append(b.faults, record.Fault{ID: len(b.faults) + 1, Kind: kind, Target: target, Start: start, End: end, Paused: paused})
	return b
}

// build orders the writes and applies the store's rule to them.
func (b *builder) build() record.History {
	ws := slices.Clone(b.writes)
	slices.SortStableFunc(ws, func(x, y record.Write) int { return cmp.Compare(x.At, y.At) })
	var highest uint64
	seen := false
	for i := range ws {
		ws[i].Accepted = !seen || ws[i].Token >= highest
		if ws[i].Accepted {
			seen, highest = true, max(highest, ws[i].Token)
		}
	}
	run := b.run
	if len(ws) > 0 {
		run.Duration = ws[len(ws)-1].At
	}
	return record.History{Run: run, Writes: ws, Faults: slices.Clone(b.faults)}
}

// failsWith asserts that r fails, with a failure containing want.
func failsWith(t *testing.T, r Report, want string) {
	t.Helper()
	for _, f := range r.Failures() {
		if strings.Contains(f, want) {
			return
		}
	}
	t.Errorf("failures %q; want one naming %q", r.Failures(), want)
}

func passes(t *testing.T, r Report) {
	t.Helper()
	if !r.OK() {
		t.Errorf("report fails: %q", r.Failures())
	}
}
