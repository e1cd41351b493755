package harness

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/chaos/internal/check"
	"github.com/batonhq/baton/chaos/internal/record"
	"github.com/batonhq/baton/chaos/internal/turns"
	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// The test binary is also the children's writer: the harness runs it with
// BATON_CHAOS_CHILD=1.
func TestMain(m *testing.M) {
	if os.Getenv("BATON_CHAOS_CHILD") == "1" {
		os.Exit(ChildMain(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// run runs cfg in a fresh directory with the test binary as the child, and
// checks what it recorded. A backend that cannot run here skips the test
// (or fails it where servers are required, as in CI).
func run(t *testing.T, cfg Config) (record.History, check.Report) {
	t.Helper()
	if cfg.Backend == "raft" || cfg.Backend == "zookeeper-ensemble" {
		netns.Require(t)
	}
	cfg.Dir = t.TempDir()
	cfg.Child = []string{"env", "BATON_CHAOS_CHILD=1", os.Args[0]}
	var log testserver.SyncBuffer
	cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
	hist, err := Run(t.Context(), cfg)
	var tool *testserver.ToolError
	if errors.Is(err, testserver.ErrJavaMissing) || errors.As(err, &tool) {
		testserver.Unavailable(t, cfg.Backend, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("harness log:\n%s", log.String())
			for _, c := range []string{"c1", "c2", "c3"} {
				if b, err := os.ReadFile(cfg.Dir + "/" + c + ".log"); err == nil {
					t.Logf("%s's log, last lines:\n%s", c, tail(string(b), 40))
				}
			}
		}
	})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	rep := check.Check(hist)
	t.Logf("%d faults %v, %d terms, %d writes (%d refused), availability outside fault windows %.4f, paused overlaps %d",
		rep.Faults, rep.FaultsByKind, rep.Terms, rep.Writes, rep.Refused, rep.Availability.Fraction, rep.Overlaps.Paused)
	return hist, rep
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// A short seeded run per backend, with every fault kind it takes (wipe
// too: tokens must rise across the loss of the backend's data): no
// fencing violation, no token regression, no overlap outside the paused
// case. (Availability is reported, not asserted: a short run on a busy
// machine measures the machine.)
func TestShortRun(t *testing.T) {
	for i, b := range Backends {
		t.Run(b, func(t *testing.T) {
			// The runs are mostly waiting (for faults to heal, for leases
			// to expire): side by side they take the time of the longest.
			t.Parallel()
			_, rep := run(t, Config{Backend: b, Kinds: KindsOf(b), Faults: 20, Interval: time.Second, Seed: int64(100 + i)})
			if rep.Faults != 20 {
				t.Errorf("%d faults injected, want 20", rep.Faults)
			}
			for _, f := range rep.Failures() {
				t.Error(f)
			}
		})
	}
}

// A short seeded run per backend that keeps a queue of waiting processes,
// with three processes of three candidates each (--turns 3) and every
// fault kind such a process takes (wipe too): the candidates of a process
// take turns, terms end on their own and hand the lease over, killed
// processes leave their queue entries behind, and still no fencing
// violation, token regression or overlap outside the paused case.
func TestTurnsRun(t *testing.T) {
	for i, b := range turns.Schemes {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			hist, rep := run(t, Config{Backend: b, Turns: 3, Kinds: TurnsKinds(KindsOf(b)), Faults: 15,
				Interval: time.Second, Seed: int64(200 + i)})
			for _, f := range rep.Failures() {
				t.Error(f)
			}
			// Turns were taken: some process led with two of its
			// candidates, and more than one process led.
			byProcess := map[string]map[string]bool{}
			for _, w := range hist.Writes {
				if !w.Accepted {
					continue
				}
				p := check.ProcessOf(w.Candidate)
				if byProcess[p] == nil {
					byProcess[p] = map[string]bool{}
				}
				byProcess[p][w.Candidate] = true
			}
			most := 0
			for _, ids := range byProcess {
				most = max(most, len(ids))
			}
			if most < 2 || len(byProcess) < 2 {
				t.Errorf("leaders by process %v: want two processes, one with two candidates that led", byProcess)
			}
		})
	}
}

// The harness can fail: a deliberately broken baton build is caught
// within a few faults. Two candidates, so that every hand-over goes to the
// other one and the outcome does not depend on who wins.
func TestBrokenBuildsAreCaught(t *testing.T) {
	t.Run("ignore-deadline", func(t *testing.T) {
		t.Parallel()
		// The holder's baton is stopped past its TTL; its guard, told to
		// ignore safe-until, lets the command go on while the other leads.
		_, rep := run(t, Config{Backend: "etcd", Broken: "ignore-deadline", Candidates: 2,
			Kinds: []string{KindStopBaton}, Faults: 2, MaxActive: 1, Interval: time.Second, Seed: 1})
		if rep.Overlaps.Unexplained == 0 {
			t.Errorf("no overlap found in a run of a build whose guard ignores the deadline; failures: %v", rep.Failures())
		}
		if rep.OK() {
			t.Error("the check passed a broken build")
		}
	})
	t.Run("stale-token", func(t *testing.T) {
		t.Parallel()
		// Every second term of a baton process hands its command a token
		// of an earlier epoch; with two candidates and the holder stopped
		// past its TTL each time, the third term is a process's second.
		_, rep := run(t, Config{Backend: "etcd", Broken: "stale-token", Candidates: 2,
			Kinds: []string{KindStopBaton}, Faults: 3, MaxActive: 1, Interval: time.Second, Seed: 1})
		if rep.Tokens.Regressions == 0 {
			t.Errorf("no token regression found in a run of a build that hands out stale tokens; failures: %v", rep.Failures())
		}
		if rep.OK() {
			t.Error("the check passed a broken build")
		}
	})
}

// A seed gives the same schedule of kinds and waits, whatever the run does.
func TestScheduleFromSeed(t *testing.T) {
	a, b := schedule(7, 50), schedule(7, 50)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("draw %d differs for one seed: %+v, %+v", i, a[i], b[i])
		}
	}
	if c := schedule(8, 50); c[0] == a[0] && c[1] == a[1] {
		t.Error("seeds 7 and 8 gave the same first draws")
	}
}

func schedule(seed int64, n int) []draw {
	h := &Harness{cfg: Config{Backend: "etcd", Seed: seed, Interval: time.Second}}
	r := h.rng()
	out := make([]draw, n)
	for i := range out {
		out[i] = h.next(r, DefaultKinds("etcd"))
	}
	return out
}

// A run whose candidates all exit with status 2 before any led (baton
// refused their flags: a --ttl below the raft group's floor, say) ends at
// once, quoting baton's reason, instead of restarting them for the two
// minutes the first leader may take.
func TestRefusedFlagsEndTheStart(t *testing.T) {
	dir := t.TempDir()
	h := &Harness{cfg: Config{Dir: dir}}
	for _, id := range []string{"c1", "c2"} {
		h.cands = append(h.cands, &candidate{id: id, h: h})
	}
	reason := "--ttl 2s: below 2.21s, the shortest TTL the embedded raft group can honour"
	if err := os.WriteFile(dir+"/c1.log", []byte("=== baton-chaos: c1 started\nbaton: "+reason+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.exits = []string{"c1: exit status 2 at 10ms", "c1: exit status 2 at 1.1s"}
	if err := h.flagsRefused(); err != nil {
		t.Fatalf("with c2 not yet refused: %v, want none", err)
	}
	h.exits = append(h.exits, "c2: exit status 1 at 1.2s")
	if err := h.flagsRefused(); err != nil {
		t.Fatalf("with c2 exited for another reason: %v, want none", err)
	}
	h.exits = append(h.exits, "c2: exit status 2 at 1.3s")
	if err := h.flagsRefused(); err == nil || !strings.Contains(err.Error(), reason) {
		t.Fatalf("with every candidate refused: %v, want an error quoting %q", err, reason)
	}
}
