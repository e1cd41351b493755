package check

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// handOver is c1 leading [0, 1 s], killed at 1 s, and c2 leading from
// 1.5 s to 3 s: the last c1 write is at 1000 ms, so the leader counts as
// active until 1100 ms (5 heartbeats), and c2's first write at 1500 ms ends
// the gap.
func handOver() *builder {
	return newBuilder().
		child("c1", 101, 10, 0, time.Second).
		child("c2", 201, 20, 1500*ms, 3*time.Second)
}

func TestCleanHandOverFigures(t *testing.T) {
	r := Check(handOver().fault("kill", "c1", time.Second, time.Second, false).build())
	passes(t, r)
	if r.Writes != 51+76 || r.Accepted != r.Writes || r.Terms != 2 || r.Children != 2 || r.Faults != 1 {
		t.Errorf("counts: writes %d accepted %d terms %d children %d faults %d", r.Writes, r.Accepted, r.Terms, r.Children, r.Faults)
	}
	if r.Seed != 7 || r.Command != "baton-chaos --seed 7" {
		t.Errorf("seed %d, command %q: not copied from the run", r.Seed, r.Command)
	}
	fr := r.FaultRecovery[0]
	want := FaultRecovery{ID: 1, Kind: "kill", Target: "c1", Start: time.Second, End: time.Second,
		Window:      Interval{time.Second, 1500 * ms},
		Interrupted: true, Leaderless: 400 * ms, Recovery: 500 * ms, Recovered: true,
		From: TermRef{"c1", 10}, To: TermRef{"c2", 20}, HandOver: 500 * ms}
	if fr != want {
		t.Errorf("fault recovery\n got %+v\nwant %+v", fr, want)
	}
	av := r.Availability
	if av.Span != (Interval{0, 3 * time.Second}) || av.Inside != 500*ms || av.Outside != 2500*ms ||
		av.ActiveOutside != 2500*ms || av.Fraction != 1 || av.Leaderless != 0 || av.GapTolerance != 100*ms {
		t.Errorf("availability %+v", av)
	}
	if got := av.Overall; got != 2600.0/3000 {
		t.Errorf("overall %v, want %v", got, 2600.0/3000)
	}
	k := r.Recovery["kill"]
	if k.Faults != 1 || k.Interrupted != 1 || k.HandedOver != 1 || k.Recovery.P99 != 500*ms || k.HandOver.Max != 500*ms || k.Leaderless.P50 != 400*ms {
		t.Errorf("kill recovery %+v", k)
	}
}

// TestLeaderlessOutsideFaults: the same hand-over with no fault to explain
// it is leaderless time against availability, a failure only when the
// caller sets a threshold.
func TestLeaderlessOutsideFaults(t *testing.T) {
	r := Check(handOver().build())
	passes(t, r)
	av := r.Availability
	if av.Leaderless != 1 || av.Longest != (Interval{1100 * ms, 1500 * ms}) || av.LeaderlessTime != 400*ms {
		t.Errorf("leaderless %d %s %+v", av.Leaderless, av.LeaderlessTime, av.Longest)
	}
	if want := 2600.0 / 3000; av.Fraction != want {
		t.Errorf("fraction %v, want %v", av.Fraction, want)
	}
	r.MinAvailability = 0.999
	failsWith(t, r, "availability outside fault windows")
}

// TestRecoveryBudgetCaps: leaderless time past End+RecoveryBudget counts
// against availability.
func TestRecoveryBudgetCaps(t *testing.T) {
	b := handOver().fault("kill", "c1", time.Second, time.Second, false)
	b.run.RecoveryBudget = 200 * ms
	r := Check(b.build())
	fr := r.FaultRecovery[0]
	if fr.Window != (Interval{time.Second, 1200 * ms}) || fr.Recovery != 500*ms {
		t.Errorf("window %+v recovery %s", fr.Window, fr.Recovery)
	}
	if av := r.Availability; av.Leaderless != 1 || av.LeaderlessTime != 300*ms {
		t.Errorf("leaderless %d, %s; want 1, 300ms", av.Leaderless, av.LeaderlessTime)
	}
}

func TestUninterruptedFault(t *testing.T) {
	r := Check(newBuilder().child("c1", 1, 5, 0, 2*time.Second).
		fault("kill", "c3", 500*ms, 500*ms, false).build())
	passes(t, r)
	fr := r.FaultRecovery[0]
	if fr.Interrupted || fr.Recovery != 0 || fr.Window != (Interval{500 * ms, 500 * ms}) {
		t.Errorf("%+v", fr)
	}
	if k := r.Recovery["kill"]; k.Faults != 1 || k.Interrupted != 0 || k.Recovery.N != 0 {
		t.Errorf("%+v", k)
	}
}

func TestUnrecovered(t *testing.T) {
	b := newBuilder().child("c1", 1, 5, 0, time.Second).fault("kill", "c1", time.Second, time.Second, false)
	h := b.build()
	h.Run.Duration = 5 * time.Second
	r := Check(h)
	fr := r.FaultRecovery[0]
	if !fr.Interrupted || fr.Recovered || fr.Recovery != 4*time.Second || fr.HandOver != 0 {
		t.Errorf("%+v", fr)
	}
	if k := r.Recovery["kill"]; k.Unrecovered != 1 {
		t.Errorf("%+v", k)
	}
}

func TestAcceptedLowerTokenFails(t *testing.T) {
	h := handOver().build()
	// A store that lets a stale write through.
	h.Writes = append(h.Writes, h.Writes[len(h.Writes)-1])
	last := &h.Writes[len(h.Writes)-1]
	last.At += ms
	last.Candidate, last.Token, last.PID, last.Accepted = "c1", 10, 102, true
	r := Check(h)
	failsWith(t, r, "1 fencing violations")
	if ex := r.Fencing.Examples; len(ex) != 1 || ex[0].At != 3001*ms || ex[0].Highest != (TermRef{"c2", 20}) {
		t.Errorf("examples %+v", ex)
	}
}

func TestStoreRefusingValidWriteFails(t *testing.T) {
	h := handOver().build()
	h.Writes[len(h.Writes)-1].Accepted = false
	failsWith(t, Check(h), "store broke its rule")
}

func TestStaleRefusedCounted(t *testing.T) {
	// c1 paused with its guard from 1 s to 3 s; c2 leads from 2 s; c1's
	// child resumes and writes three times (refused) before it dies.
	b := newBuilder().
		child("c1", 101, 10, 0, time.Second).
		child("c2", 201, 20, 2*time.Second, 4*time.Second).
		child("c1", 101, 10, 3*time.Second, 3040*ms).
		fault("stop-tree", "c1", time.Second, 3*time.Second, true)
	r := Check(b.build())
	passes(t, r)
	if r.Fencing.StaleRefused != 3 || r.Fencing.StaleRefusedBy["c1"] != 3 {
		t.Errorf("stale refused %d, by %v", r.Fencing.StaleRefused, r.Fencing.StaleRefusedBy)
	}
	ov := r.Overlaps
	if ov.Paused != 1 || ov.Unexplained != 0 || len(ov.Examples) != 1 {
		t.Fatalf("overlaps %+v", ov)
	}
	want := Overlap{Interval: Interval{2 * time.Second, 3040 * ms},
		Stale: ChildRef{"c1", 10, 101}, Newer: ChildRef{"c2", 20, 201}, PausedBy: 1}
	if ov.Examples[0] != want {
		t.Errorf("overlap\n got %+v\nwant %+v", ov.Examples[0], want)
	}

	// The same history under a fault that did not stop the child: the
	// overlap is unexplained.
	b.faults[0].Paused = false
	failsWith(t, Check(b.build()), "1 overlaps outside the paused case")

	// A paused fault on another candidate explains nothing.
	b.faults[0].Paused, b.faults[0].Target = true, "c3"
	failsWith(t, Check(b.build()), "1 overlaps outside the paused case")

	// A paused fault whose window ended before the overlap began explains
	// nothing either.
	b.faults[0].Target, b.faults[0].End = "c1", 1500*ms
	failsWith(t, Check(b.build()), "1 overlaps outside the paused case")
}

func TestOverlapOutsidePausedFails(t *testing.T) {
	// c1's child outlives its term by a second: a guard that missed its
	// deadline. Its late writes are refused, but two children act at once.
	r := Check(newBuilder().
		child("c1", 101, 10, 0, 2*time.Second).
		child("c2", 201, 20, time.Second, 3*time.Second).build())
	failsWith(t, r, "overlaps outside the paused case")
	ov := r.Overlaps
	if ov.Unexplained != 1 || ov.UnexplainedTime != time.Second || ov.Examples[0].Interval != (Interval{time.Second, 2 * time.Second}) {
		t.Errorf("%+v", ov)
	}
	if r.Fencing.Violations != 0 || r.Fencing.StaleRefused != 50 {
		t.Errorf("fencing %+v", r.Fencing)
	}
}

// TestOverlapStaleAccepted: an overlap whose stale child's writes were
// accepted is also a fencing violation, and says so.
func TestOverlapStaleAccepted(t *testing.T) {
	h := newBuilder().
		child("c1", 101, 10, 0, 2*time.Second).
		child("c2", 201, 20, time.Second, 3*time.Second).build()
	for i := range h.Writes {
		h.Writes[i].Accepted = true
	}
	r := Check(h)
	if r.Overlaps.Examples[0].StaleAccepted != 50 || r.Fencing.Violations != 50 {
		t.Errorf("stale accepted %d, violations %d; want 50, 50", r.Overlaps.Examples[0].StaleAccepted, r.Fencing.Violations)
	}
}

func TestTokenRegressionFails(t *testing.T) {
	// A backend that grants c2 the token c1 held: the store accepts equal
	// tokens, so only the order of terms shows it.
	r := Check(newBuilder().
		child("c1", 101, 20, 0, time.Second).
		child("c2", 201, 20, 1500*ms, 3*time.Second).build())
	failsWith(t, r, "1 token regressions")
	if ex := r.Tokens.Examples; len(ex) != 1 || ex[0].Term != (TermRef{"c2", 20}) || ex[0].Previous != (TermRef{"c1", 20}) || ex[0].At != 1500*ms {
		t.Errorf("examples %+v", ex)
	}

	// A backend that grants a lower token: every write of the new term is
	// refused, and nothing delayed it.
	r = Check(newBuilder().
		child("c1", 101, 20, 0, time.Second).
		child("c2", 201, 10, 1500*ms, 3*time.Second).build())
	failsWith(t, r, "1 token regressions")
	if r.Tokens.NeverAccepted != 1 || r.Tokens.Delayed != 0 {
		t.Errorf("%+v", r.Tokens)
	}

	// A store that accepted that lower token: a regression in the order of
	// terms, and fencing violations.
	h := newBuilder().
		child("c1", 101, 20, 0, time.Second).
		child("c2", 201, 10, 1500*ms, 3*time.Second).build()
	for i := range h.Writes {
		h.Writes[i].Accepted = true
	}
	r = Check(h)
	failsWith(t, r, "token regressions")
	failsWith(t, r, "fencing violations")
}

// TestDelayedTermNotARegression: a term granted before a higher one whose
// child first wrote late because its candidate was stopped.
func TestDelayedTermNotARegression(t *testing.T) {
	r := Check(newBuilder().
		child("c2", 201, 20, 0, 2*time.Second).
		child("c1", 101, 10, 1500*ms, 1540*ms).
		fault("stop-tree", "c1", 500*ms, 1500*ms, true).build())
	if r.Tokens.Regressions != 0 || r.Tokens.Delayed != 1 {
		t.Errorf("%+v", r.Tokens)
	}
	if r.Overlaps.Paused != 1 || r.Overlaps.Unexplained != 0 {
		t.Errorf("%+v", r.Overlaps)
	}
}

// TestStalledTermNotARegression: a stall (a short SIGSTOP of the
// candidate's baton) that delayed a term's first write past a higher
// term's excuses its refused writes as a stop-baton does.
func TestStalledTermNotARegression(t *testing.T) {
	r := Check(newBuilder().
		child("c2", 201, 20, 0, 2*time.Second).
		child("c1", 101, 10, 1500*ms, 1540*ms).
		fault("stall", "c1", 700*ms, 1500*ms, false).build())
	if r.Tokens.Regressions != 0 || r.Tokens.Delayed != 1 {
		t.Errorf("%+v", r.Tokens)
	}
}

// TestRestartWithinTermIsOneTerm: two children of one candidate with one
// token, one after the other, are one term: no regression, no overlap.
func TestRestartWithinTermIsOneTerm(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 10, 0, time.Second).
		child("c1", 102, 10, 1100*ms, 2*time.Second).
		child("c2", 201, 20, 3*time.Second, 4*time.Second).build())
	passes(t, r)
	if r.Terms != 2 || r.Children != 3 || r.Tokens.Accepted != 2 {
		t.Errorf("terms %d children %d", r.Terms, r.Children)
	}
}

func TestNoLeaderFails(t *testing.T) {
	failsWith(t, Check(newBuilder().build()), "no write was accepted")
}

func TestUnsortedWritesSameReport(t *testing.T) {
	h := handOver().fault("kill", "c1", time.Second, time.Second, false).build()
	want := Check(h)
	shuffled := slices.Clone(h.Writes)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	h2 := h
	h2.Writes = shuffled
	if got := Check(h2); !reflect.DeepEqual(got, want) {
		t.Errorf("report differs for shuffled writes")
	}
	before := slices.Clone(h2.Writes)
	Check(h2)
	if !slices.Equal(before, h2.Writes) {
		t.Error("Check modified its input")
	}
}

func TestDist(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*ms)
	}
	d := dist(ds)
	if d != (Dist{N: 100, P50: 50 * ms, P90: 90 * ms, P99: 99 * ms, Max: 100 * ms, Mean: 50500 * time.Microsecond}) {
		t.Errorf("%+v", d)
	}
	if d := dist([]time.Duration{7 * ms}); d.P50 != 7*ms || d.P99 != 7*ms {
		t.Errorf("%+v", d)
	}
}

func TestReportJSON(t *testing.T) {
	r := Check(handOver().fault("kill", "c1", time.Second, time.Second, false).build())
	var buf bytes.Buffer
	if err := WriteJSON(&buf, r); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Recovery, r.Recovery) || back.Seed != 7 || !reflect.DeepEqual(back.Availability, r.Availability) {
		t.Errorf("JSON round trip lost figures")
	}
}

// A backend restarted while nobody leads (the gap began with an earlier
// fault, whose budget has run out) is charged with the time to recover
// after it comes back: that time is inside its window, not against
// availability.
func TestGapLastingPastAFaultIsItsToo(t *testing.T) {
	h := newBuilder().
		child("c1", 101, 5, 0, 10*time.Second).
		fault("kill", "c1", 10*time.Second, 10*time.Second, false).
		fault("restart", "backend", 12*time.Second, 60*time.Second, false).
		child("c2", 201, 6, 62*time.Second, 70*time.Second).build()
	h.Run.RecoveryBudget = 5 * time.Second
	r := Check(h)
	if r.Availability.Fraction != 1 {
		t.Errorf("availability outside fault windows %v, want 1: the gap after the restart came back is its recovery (leaderless outside: %v)",
			r.Availability.Fraction, r.Availability.Examples)
	}
	fr := r.FaultRecovery[1]
	if !fr.Interrupted || fr.Recovery != 50*time.Second {
		t.Errorf("restart: interrupted %v, recovery %s; want true, 50s", fr.Interrupted, fr.Recovery)
	}
}

// With several candidates per process (ids "cK-N", faults on process
// "cK"), a stop-tree of a process is the paused case of each of its
// candidates, and of no other process's.
func TestPausedProcessOfTurns(t *testing.T) {
	b := newBuilder().
		child("c1-2", 101, 10, 0, time.Second).
		child("c2-1", 201, 20, 2*time.Second, 4*time.Second).
		child("c1-2", 101, 10, 3*time.Second, 3040*ms).
		fault("stop-tree", "c1", time.Second, 3*time.Second, true)
	r := Check(b.build())
	passes(t, r)
	if r.Overlaps.Paused != 1 {
		t.Errorf("overlaps %+v, want one paused", r.Overlaps)
	}
	b.faults[0].Target = "c2"
	failsWith(t, Check(b.build()), "1 overlaps outside the paused case")
	// "c1" is not the process of "c10-1".
	b = newBuilder().
		child("c10-1", 101, 10, 0, time.Second).
		child("c2-1", 201, 20, 2*time.Second, 4*time.Second).
		child("c10-1", 101, 10, 3*time.Second, 3040*ms).
		fault("stop-tree", "c1", time.Second, 3*time.Second, true)
	failsWith(t, Check(b.build()), "1 overlaps outside the paused case")
}
