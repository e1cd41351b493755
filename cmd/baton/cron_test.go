package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// slotLine is one run of the cron job, as the job itself recorded it.
type slotLine struct {
	slot  time.Time
	token uint64
	ppid  int // the baton that ran it
}

func readSlots(t *testing.T, file string) []slotLine {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []slotLine
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue // empty, or a line being written
		}
		at, err1 := time.Parse(time.RFC3339, f[0])
		tok, err2 := strconv.ParseUint(f[1], 10, 64)
		ppid, err3 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("bad line in the job's file: %q", l)
		}
		out = append(out, slotLine{at, tok, ppid})
	}
	return out
}

// TestCronOncePerSlot runs three `baton cron` processes against each backend
// with a real server, kills the leader with SIGKILL in the middle of a run,
// then stops the next one with SIGTERM, and checks from the job's own record
// that no slot ran twice and, with --catch-up=last, none was skipped.
func TestCronOncePerSlot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) string
		ttl     string
	}{
		{"etcd", func(t *testing.T) string { return etcdURL(t) }, "1s"},
		{"zookeeper", func(t *testing.T) string { return zkURL(t, "/services/cron") }, "2s"},
		// Consul renews every TTL/4 of a session TTL of TTL/2: at 3 s a
		// renewal window (0.45 s) that --grace 300ms fits in.
		{"consul", func(t *testing.T) string { return consulURL(t, "/services") }, "3s"},
		// The embedded raft group, through a `baton agent`: a kill -9 of a
		// cron process is a session's death, not a member's.
		{"raft", startCronAgent, "2.5s"},
		// The last slot run is the term's state in the lease's row.
		{"postgres", pgURL, "2s"},
		{"pgbouncer", pgBouncerURL, "2s"},
		// The last slot run is the lease's state key, set by a script
		// that checks the lease key still holds the term.
		{"redis", redisURL, "2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testCronOncePerSlot(t, tc.backend(t), tc.ttl)
		})
	}
}

// startCronAgent starts a one-member raft group run by `baton agent` and
// returns its agent:// URL.
func startCronAgent(t *testing.T) string {
	_, httpAddr := startAgent(t, t.TempDir())
	return "agent://" + httpAddr
}

func testCronOncePerSlot(t *testing.T, backend, ttl string) {
	const period = 4 * time.Second // longer than a crash failover at the TTLs above
	file := filepath.Join(t.TempDir(), "slots")
	// The job records its slot first thing, then works for a while, so
	// that a kill lands in the middle of a run.
	// The job's parent is its guard; the guard's parent (field 4 of its
	// /proc stat) is the baton.
	job := fmt.Sprintf(`echo "$BATON_SLOT $BATON_TOKEN $(cut -d' ' -f4 /proc/$PPID/stat)" >> %s; sleep 1`, file)
	var procs []*batonProc
	for i := range 3 {
		procs = append(procs, startBaton(t, fmt.Sprintf("cron-%d", i+1), testEnv(),
			"cron", "--backend", backend, "--lease", "reminders", "--ttl", ttl, "--grace", "300ms",
			"--schedule", fmt.Sprintf("CRON_TZ=UTC */%d * * * * *", int(period.Seconds())), "--catch-up", "last",
			"--log-level", "debug", "--", "sh", "-c", job))
	}
	byPid := func(pid int) *batonProc {
		for _, p := range procs {
			if p.cmd.Process.Pid == pid {
				return p
			}
		}
		t.Fatalf("slot run by %d, none of the batons", pid)
		return nil
	}
	testkit.Eventually(t, 60*time.Second, "two slots to run", func() bool { return len(readSlots(t, file)) >= 2 })

	// kill -9 in the middle of a run: the job has just written its line.
	n := len(readSlots(t, file))
	testkit.Eventually(t, 30*time.Second, "the next slot to start", func() bool { return len(readSlots(t, file)) > n })
	ss := readSlots(t, file)
	killed := byPid(ss[len(ss)-1].ppid)
	if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed.wait(t, 10*time.Second)
	n = len(readSlots(t, file))
	testkit.Eventually(t, 60*time.Second, "two slots after the crash", func() bool { return len(readSlots(t, file)) >= n+2 })

	// SIGTERM to the next leader, between or during runs.
	ss = readSlots(t, file)
	stopped := byPid(ss[len(ss)-1].ppid)
	if stopped == killed {
		t.Fatalf("a slot after the crash ran on the killed baton %d", killed.cmd.Process.Pid)
	}
	if err := stopped.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := stopped.wait(t, 30*time.Second); code != 0 {
		t.Errorf("baton cron exited %d after SIGTERM, want 0", code)
	}
	n = len(readSlots(t, file))
	testkit.Eventually(t, 60*time.Second, "two slots after the hand-over", func() bool { return len(readSlots(t, file)) >= n+2 })

	ss = readSlots(t, file)
	// In file order: slots strictly increase, one period apart (none
	// twice, none skipped), and tokens never go back.
	ran := map[int]bool{}
	for i, s := range ss {
		ran[s.ppid] = true
		if s.slot.Second()%int(period.Seconds()) != 0 {
			t.Errorf("slot %s is not on the schedule", s.slot.Format(time.RFC3339))
		}
		if i == 0 {
			continue
		}
		prev := ss[i-1]
		switch d := s.slot.Sub(prev.slot); {
		case d <= 0:
			t.Errorf("slot %s ran again (or out of order) after %s", s.slot.Format(time.RFC3339), prev.slot.Format(time.RFC3339))
		case d > period:
			t.Errorf("slots skipped between %s and %s", prev.slot.Format(time.RFC3339), s.slot.Format(time.RFC3339))
		}
		if s.token < prev.token {
			t.Errorf("slot %s ran with token %d, below the earlier slot's %d", s.slot.Format(time.RFC3339), s.token, prev.token)
		}
	}
	if len(ran) < 3 {
		t.Errorf("slots ran on %d batons, want all 3 (one after each failover)", len(ran))
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].slot.Before(ss[j].slot) })
	t.Logf("%d slots from %s to %s on %d batons", len(ss), ss[0].slot.Format(time.TimeOnly), ss[len(ss)-1].slot.Format(time.TimeOnly), len(ran))
}
