package check

import (
	"testing"
	"time"
)

func logReport(t *testing.T, r Report) {
	t.Logf("OK=%v failures=%q fencing=%+v tokens=%+v overlaps paused=%d unexplained=%d", r.OK(), r.Failures(), r.Fencing, r.Tokens, r.Overlaps.Paused, r.Overlaps.Unexplained)
}

// A regression: c1 re-granted token 5 after c2's token 6: a regression, merged into c1's first term.
func TestCatchesReusedTokenAfterOtherTerm(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		child("c2", 201, 6, 1500*ms, 3*time.Second).
		child("c1", 102, 5, 3500*ms, 5*time.Second).build())
	logReport(t, r)
	if r.OK() {
		t.Errorf("passes a term granted token 5 after token 6 was accepted")
	}
}

// Not the paused case: a paused child that goes on writing for 7 s after SIGCONT.
func TestCatchesPausedOverlapUnbounded(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		fault("stop-tree", "c1", time.Second, 3*time.Second, true).
		child("c1", 101, 5, 3*time.Second, 10*time.Second).
		child("c2", 201, 6, 2*time.Second, 10*time.Second).build())
	logReport(t, r)
	if r.OK() {
		t.Errorf("7 s of overlap after the pause ended counted as paused (%s)", r.Overlaps.PausedTime)
	}
}

// Not the paused case: the pause on c1 would explain an overlap between c2's stale child and c1's NEW term.
func TestCatchesPauseExplainsUnrelatedOverlap(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		fault("stop-tree", "c1", time.Second, 3*time.Second, true).
		child("c2", 201, 6, 2*time.Second, 4*time.Second).
		child("c1", 102, 7, 3100*ms, 5*time.Second).build())
	logReport(t, r)
	if r.OK() {
		t.Errorf("c2(6)/c1(7) overlap explained by c1's pause, though c1's paused child is not in it")
	}
}

// A regression: a never-accepted (stale-token) term excused by a non-pause fault (slow) on its candidate.
func TestCatchesNeverAcceptedExcusedBySlow(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		child("c2", 201, 6, 1500*ms, 3*time.Second).
		fault("slow", "c1", 2*time.Second, 5*time.Second, false).
		child("c1", 102, 4, 3500*ms, 5*time.Second).build())
	logReport(t, r)
	if r.OK() {
		t.Errorf("stale-token term excused as Delayed by a slow fault")
	}
}

// An overlap among 3 terms; short middle term with one write.
func TestCatchesThreeTerms(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		write("c2", 201, 6, 500*ms).
		child("c3", 301, 7, 800*ms, 2*time.Second).build())
	logReport(t, r)
	if r.OK() {
		t.Errorf("BUG")
	}
}

// A regression: equal tokens from two candidates, interleaved.
func TestCatchesEqualTokens(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		child("c2", 201, 5, 1500*ms, 3*time.Second).build())
	logReport(t, r)
	if r.OK() {
		t.Errorf("BUG")
	}
}

// A never-accepted term whose first write is late in a long stop-baton window.
func TestCatchesPausedFaultOnOtherCandidateStaleTerm(t *testing.T) {
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		fault("stop-baton", "c3", 500*ms, 4*time.Second, false).
		child("c2", 201, 6, 1500*ms, 3*time.Second).
		child("c3", 301, 4, 3*time.Second, 5*time.Second).build())
	logReport(t, r)
}

// A regression between terms with unsorted first-accepted vs first-write order.
func TestCatchesOrderByFirstAccepted(t *testing.T) {
	// c2's term starts (refused writes) before c1's token-7 term, then accepted later.
	r := Check(newBuilder().
		child("c1", 101, 5, 0, time.Second).
		child("c1", 102, 7, 1500*ms, 2*time.Second).
		child("c2", 201, 6, 2500*ms, 3*time.Second).build())
	logReport(t, r)
}
