package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"golang.org/x/sys/unix"
)

// ignoreTermEnv: "1" makes a heartbeat child ignore SIGTERM, so that only
// SIGKILL stops it.
const ignoreTermEnv = "BATON_TEST_IGNORE_TERM"

// heartbeatMain is the child of the attack tests (BATON_TEST_CHILD=hb): it
// appends "start TOKEN PID UNIXNANO OTHERS_ALIVE HOLDER" like childMain,
// then "hb TOKEN PID UNIXNANO" every 50 ms: the times at which it acted.
// Unless told to ignore SIGTERM, it exits 0 on it after a "stop" line.
func heartbeatMain() int {
	file := os.Getenv(childFileEnv)
	term := make(chan os.Signal, 1)
	if os.Getenv(ignoreTermEnv) == "1" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(term, syscall.SIGTERM)
	}
	token := recordStart(file)
	tick := time.NewTicker(50 * time.Millisecond)
	for {
		select {
		case <-term:
			appendLine(file, fmt.Sprintf("stop %s %d %d", token, os.Getpid(), time.Now().UnixNano()))
			return 0
		case <-tick.C:
			appendLine(file, fmt.Sprintf("hb %s %d %d", token, os.Getpid(), time.Now().UnixNano()))
		}
	}
}

// span is the time over which one child acted: its start line to its last
// line.
type span struct {
	pid         int
	token       uint64
	first, last int64
}

func spans(evs []event) []span {
	byPid := map[int]*span{}
	var order []int
	for _, e := range evs {
		s, ok := byPid[e.pid]
		if !ok {
			s = &span{pid: e.pid, token: e.token, first: e.at, last: e.at}
			byPid[e.pid] = s
			order = append(order, e.pid)
		}
		s.first, s.last = min(s.first, e.at), max(s.last, e.at)
	}
	var out []span
	for _, pid := range order {
		out = append(out, *byPid[pid])
	}
	slices.SortFunc(out, func(a, b span) int { return int(a.first - b.first) })
	return out
}

// checkNoOverlap fails t if two children acted at once: a child's first
// line comes after its predecessor's last line (the lines carry each
// child's own reading of the host's clock), and tokens increase.
func checkNoOverlap(t *testing.T, file string) {
	t.Helper()
	ss := spans(readEvents(file))
	for i := 1; i < len(ss); i++ {
		prev, cur := ss[i-1], ss[i]
		if cur.first <= prev.last {
			t.Errorf("two children acted at once for %s: child %d (token %d) from %s, while child %d (token %d) acted until %s",
				time.Duration(prev.last-cur.first), cur.pid, cur.token, time.Unix(0, cur.first).Format("15:04:05.000"),
				prev.pid, prev.token, time.Unix(0, prev.last).Format("15:04:05.000"))
		}
		if cur.token <= prev.token {
			t.Errorf("tokens do not increase: %d then %d", prev.token, cur.token)
		}
	}
}

// heartbeatsOf counts pid's heartbeat lines.
func heartbeatsOf(file string, pid int) int {
	n := 0
	for _, e := range readEvents(file) {
		if e.kind == "hb" && e.pid == pid {
			n++
		}
	}
	return n
}

// TestRunFrozenHolder is the attack of a stopped (SIGSTOP) holder: three
// `baton run --ttl 4s` on a real etcd, each child writing a heartbeat every
// 50 ms; the holder's baton alone, or its whole process group, is stopped
// for longer than the TTL. A standby takes over, and the frozen holder's
// child must have stopped before the standby's started: its guard, in a
// process group of its own, stops it by the last safe-until baton passed on.
func TestRunFrozenHolder(t *testing.T) {
	t.Parallel()
	for _, group := range []bool{false, true} {
		name := "baton"
		if group {
			name = "process-group"
		}
		t.Run("etcd/"+name, func(t *testing.T) {
			t.Parallel()
			backend := etcdURL(t)
			testRunFrozenHolder(t, func(int) []string { return []string{"--backend", backend} }, nil, group)
		})
		t.Run("raft/"+name, func(t *testing.T) {
			t.Parallel()
			args, env := raftGroup(t, 3)
			testRunFrozenHolder(t, args, env, group)
		})
	}
}

// raftGroup makes material for a raft group of n `baton run` members on
// loopback with `baton tls`, and returns each member's flags and the
// environment with the group's secret.
func raftGroup(t *testing.T, n int) (args func(i int) []string, env []string) {
	t.Helper()
	dir := t.TempDir()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	var addrs []string
	for i := range n {
		name := fmt.Sprintf("m%d", i+1)
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name, "--host", "127.0.0.1"); r.code != 0 {
			t.Fatalf("tls cert: %d %s", r.code, r.stderr)
		}
		addrs = append(addrs, freePort(t))
	}
	return func(i int) []string {
		name := fmt.Sprintf("m%d", i+1)
		return []string{"--backend", "raft://", "--bind", addrs[i],
			"--join", "static:" + strings.Join(addrs, ","), "--bootstrap-expect", strconv.Itoa(n),
			"--tls-ca", filepath.Join(dir, "ca.pem"),
			"--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem")}
	}, []string{"BATON_SECRET=frozen-holder-test-secret-0123456789"}
}

// testRunFrozenHolder runs the attack with three members; args gives member
// i's backend flags, extraEnv is added to their environment.
func testRunFrozenHolder(t *testing.T, args func(i int) []string, extraEnv []string, group bool) {
	file := filepath.Join(t.TempDir(), "events")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	killLeftoverChildren(t, file)
	env := testEnv(append([]string{childEnv + "=hb", childFileEnv + "=" + file}, extraEnv...)...)
	var procs []*batonProc
	for i := range 3 {
		a := append(append([]string{"run"}, args(i)...), "--lease", "frozen", "--ttl", "4s", "--log-level", "debug", "--", self)
		procs = append(procs, startBatonAttr(t, fmt.Sprintf("baton-%d", i+1), env, true, a...))
	}
	testkit.Eventually(t, 30*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	testkit.Eventually(t, 10*time.Second, "the first child's heartbeats", func() bool { return heartbeatsOf(file, first.pid) >= 5 })
	leader := leaderProc(t, procs, first.pid)

	target := leader.cmd.Process.Pid
	if group {
		target = -target // baton was started with a process group of its own
	}
	if err := syscall.Kill(target, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	testkit.Eventually(t, 30*time.Second, "a standby's child to start", func() bool { return len(starts(readEvents(file))) >= 2 })
	second := starts(readEvents(file))[1]
	testkit.Eventually(t, 10*time.Second, "the new child's heartbeats", func() bool { return heartbeatsOf(file, second.pid) >= 10 })
	// The TTL runs from the holder's last renewal, up to a renew interval
	// before the stop, so the standby may take over sooner than a TTL after
	// it; the attack is a freeze longer than the TTL, so it lasts that long
	// whenever the takeover came.
	if rest := 4*time.Second + 250*time.Millisecond - time.Since(stopped); rest > 0 {
		time.Sleep(rest)
	}
	frozenFor := time.Since(stopped)
	if err := syscall.Kill(target, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("the holder was stopped for %s; the standby's child started %s after the stop",
		frozenFor.Round(time.Millisecond), time.Duration(second.at-stopped.UnixNano()).Round(time.Millisecond))
	if alive(first.pid) {
		t.Errorf("the frozen holder's child %d still runs beside its successor", first.pid)
	}
	if second.others != 0 {
		t.Errorf("the standby's child started while %d other children were alive", second.others)
	}
	// The resumed holder finds its term over and stands by; its child
	// must not come back to life. (Whoever holds the lease by then: with
	// raft, the resumed member can disturb the group for a moment.)
	resumed := time.Now().UnixNano()
	testkit.Eventually(t, 20*time.Second, "a second of heartbeats after the resume", func() bool {
		n := 0
		for _, e := range readEvents(file) {
			if e.kind == "hb" && e.at > resumed {
				n++
			}
		}
		return n >= 20
	})
	checkNoOverlap(t, file)
}

// TestRunKilledHolderWrapperScript is the attack of a holder killed with
// SIGKILL (as the OOM killer would) whose command is a wrapper script: bash
// forks the job, which must not outlive baton and act beside the next
// holder; it ignores SIGTERM, so only the guard's SIGKILL stops it.
func TestRunKilledHolderWrapperScript(t *testing.T) {
	t.Parallel()
	backend := etcdURL(t)
	file := filepath.Join(t.TempDir(), "events")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	killLeftoverChildren(t, file)
	env := testEnv(childEnv+"=hb", childFileEnv+"="+file, ignoreTermEnv+"=1")
	var procs []*batonProc
	for i := range 2 {
		procs = append(procs, startBaton(t, fmt.Sprintf("baton-%d", i+1), env,
			"run", "--backend", backend, "--lease", "wrapped", "--ttl", "4s", "--grace", "500ms", "--",
			"bash", "-c", `"$0"; echo done`, self))
	}
	testkit.Eventually(t, 30*time.Second, "a job to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	leader := leaderProc(t, procs, first.pid)
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	leader.wait(t, 10*time.Second)
	// Dead by the safe-until the guard last got: within the TTL.
	testkit.Eventually(t, 10*time.Second, "the killed holder's job to die", func() bool { return !alive(first.pid) })
	t.Logf("the job died within %s of the kill", time.Since(killed).Round(time.Millisecond))
	testkit.Eventually(t, 30*time.Second, "the standby's job to start", func() bool { return len(starts(readEvents(file))) >= 2 })
	second := starts(readEvents(file))[1]
	testkit.Eventually(t, 10*time.Second, "the new job's heartbeats", func() bool { return heartbeatsOf(file, second.pid) >= 10 })
	if second.others != 0 {
		t.Errorf("the standby's job started while %d other jobs were alive", second.others)
	}
	checkNoOverlap(t, file)
}

// TestRunKillsEscapedDescendant: a descendant that left the command's tree
// the way a daemon does (double fork, setsid; it ignores SIGTERM) is gone
// when the term ends: when baton stops on SIGTERM it resigns only after, and
// when baton is killed its guard stops it.
func TestRunKillsEscapedDescendant(t *testing.T) {
	t.Parallel()
	backend := etcdURL(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig]
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "events")
			killLeftoverChildren(t, file)
			env := testEnv(childEnv+"=hb", childFileEnv+"="+file, ignoreTermEnv+"=1")
			b := startBaton(t, "baton", env, "run", "--backend", backend, "--lease", "escape-"+name,
				"--ttl", "4s", "--grace", "500ms", "--", "sh", "-c", `(setsid "$0" &); exec sleep 1000`, self)
			testkit.Eventually(t, 30*time.Second, "the escapee to start", func() bool { return len(starts(readEvents(file))) >= 1 })
			esc := starts(readEvents(file))[0]
			if sid, err := unix.Getsid(esc.pid); err != nil || sid != esc.pid {
				t.Fatalf("the escapee %d is not in a session of its own (sid %d, %v)", esc.pid, sid, err)
			}
			if err := b.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			code := b.wait(t, 30*time.Second)
			if sig == syscall.SIGTERM {
				if code != 0 {
					t.Errorf("baton exited %d after SIGTERM, want 0", code)
				}
				// baton returns only once its command's tree is gone.
				if alive(esc.pid) {
					t.Errorf("baton exited while the escaped descendant %d still ran", esc.pid)
				}
				return
			}
			testkit.Eventually(t, 10*time.Second, "the escaped descendant of a killed baton to die", func() bool { return !alive(esc.pid) })
		})
	}
}
