package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// The attacks on the guard itself, as a plain user would make them: the
// batons run with testkit.Unprivileged's credentials (nobody when the test
// is root, the test's own user otherwise), so their guards have no cgroup
// and only the process tree holds a term's descendants. The command starts
// two grandchildren that double-fork into sessions of their own (setsid)
// and ignore SIGTERM; each appends a heartbeat with its own timestamp to a
// shared file every 50 ms.

// escapingJob is the command: two setsid grandchildren running this test
// binary as heartbeatMain, and a shell that sleeps.
const escapingJob = `(setsid "$0" &); (setsid "$0" &); exec sleep 1000`

// sharedEventFile returns a file that batons running as another user
// (testkit.Unprivileged) can write their children's events to, and makes
// this test binary and baton executable by them.
func sharedEventFile(t *testing.T) (file, self string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	testkit.ShareWith(t, dir)
	testkit.ShareWith(t, self)
	testkit.ShareWith(t, batonBin)
	if os.Geteuid() == 0 {
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "events"), self
}

// startUnprivilegedBaton is startBaton with testkit.Unprivileged's
// credentials.
func startUnprivilegedBaton(t *testing.T, name string, env []string, args ...string) *batonProc {
	t.Helper()
	p := &batonProc{name: name, out: new(testserver.SyncBuffer), done: make(chan struct{})}
	p.cmd = exec.Command(batonBin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.WaitDelay = 5 * time.Second
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: testkit.Unprivileged(t)}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		<-p.done
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", name, strings.Join(args, " "), p.out)
		}
	})
	return p
}

// guardOf returns the guard above pid, a descendant of the command (the
// guard is a subreaper: an orphan's parent is the guard), failing the test
// if pid's parent is not a guard.
func guardOf(t *testing.T, pid int) int {
	t.Helper()
	_, ppid, ok := procStat(pid)
	if !ok {
		t.Fatalf("process %d is gone", pid)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil || strings.TrimSpace(string(comm)) != "baton-guard" {
		t.Fatalf("the parent %d of %d is %q, not a guard (%v)", ppid, pid, comm, err)
	}
	return ppid
}

// checkNoLateEscapee fails t if one of pids acted at or after at, or still
// runs.
func checkNoLateEscapee(t *testing.T, file string, pids map[int]bool, at int64, what string) {
	t.Helper()
	var late []event
	for _, e := range readEvents(file) {
		if pids[e.pid] && e.at >= at {
			late = append(late, e)
		}
	}
	if len(late) > 0 {
		last := late[len(late)-1]
		t.Errorf("the attacked term's grandchildren acted %d times after %s, the last (process %d) %s after",
			len(late), what, last.pid, time.Duration(last.at-at).Round(time.Millisecond))
	}
	for pid := range pids {
		if alive(pid) {
			t.Errorf("the attacked term's grandchild %d still runs after %s", pid, what)
		}
	}
}

// guardAttack is one attack on the holder's guard.
type guardAttack struct {
	name      string
	cron      bool // baton cron, a run every second, instead of baton run
	memory    bool // memory://, one baton; else etcd, two
	cut       bool // cut the holder's link to etcd instead of SIGTERM to it
	killGuard bool // SIGKILL the guard, and nothing else
}

// TestRunStoppedGuard is the attack of a guard stopped alone (SIGSTOP of its
// pid), with no cgroup: then the holder's baton is stopped with SIGTERM, or
// its link to the backend is cut. The guard is the subreaper that keeps the
// command's escaped grandchildren in its tree; whatever baton does to get
// rid of a guard that does not answer, none of the grandchildren may act
// once the next holder's command has started (etcd, cron), nor once baton
// exited (memory://, with nobody else to take over).
func TestRunStoppedGuard(t *testing.T) {
	t.Parallel()
	for _, tc := range []guardAttack{
		{name: "etcd/SIGTERM"},
		{name: "etcd/cut", cut: true},
		{name: "memory/SIGTERM", memory: true},
		{name: "cron/etcd/SIGTERM", cron: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testGuardAttack(t, tc)
		})
	}
}

// TestRunKilledGuard is the attack of a guard killed with SIGKILL by another
// process of the same user, with no cgroup: the command dies with it
// (parent-death signal), and its escaped grandchildren are orphaned. baton
// is a subreaper, so they come to it, and it kills them before it lets the
// lease go (run) or starts the next run (cron): none may act once the next
// command has started.
func TestRunKilledGuard(t *testing.T) {
	t.Parallel()
	for _, tc := range []guardAttack{
		{name: "etcd", killGuard: true},
		{name: "cron/etcd", cron: true, killGuard: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testGuardAttack(t, tc)
		})
	}
}

func testGuardAttack(t *testing.T, tc guardAttack) {
	standby := !tc.memory
	file, self := sharedEventFile(t)
	killLeftoverChildren(t, file)
	env := testEnv(childEnv+"=hb", childFileEnv+"="+file, ignoreTermEnv+"=1")
	var srv *testserver.Etcd
	if !tc.memory {
		srv = testserver.StartEtcd(t)
	}
	n := 1
	if standby {
		n = 2
	}
	var procs []*batonProc
	var proxies []*testserver.Proxy
	for i := range n {
		backend := "memory://"
		if srv != nil {
			px := testserver.StartProxy(t, srv.Endpoint())
			proxies = append(proxies, px)
			backend = "etcd://" + px.Addr()
		}
		args := []string{"run"}
		if tc.cron {
			args = []string{"cron", "--schedule", "* * * * * *"}
		}
		args = append(args, "--backend", backend, "--lease", "attacked-guard", "--ttl", "4s", "--grace", "500ms",
			"--log-level", "debug", "--", "sh", "-c", escapingJob, self)
		procs = append(procs, startUnprivilegedBaton(t, fmt.Sprintf("baton-%d", i+1), env, args...))
	}
	testkit.Eventually(t, 30*time.Second, "both grandchildren to start", func() bool { return len(starts(readEvents(file))) >= 2 })
	first := starts(readEvents(file))[0]
	attacked := map[int]bool{}
	for _, s := range starts(readEvents(file))[:2] {
		attacked[s.pid] = true
	}
	testkit.Eventually(t, 10*time.Second, "the grandchildren's heartbeats", func() bool { return heartbeatsOf(file, first.pid) >= 3 })
	guard := guardOf(t, first.pid)
	var holder *batonProc
	for i, p := range procs {
		if _, ppid, _ := procStat(guard); ppid == p.cmd.Process.Pid {
			holder = p
			if tc.cut {
				proxies[i].Cut()
			}
		}
	}
	if holder == nil {
		t.Fatalf("the guard %d is no baton's", guard)
	}
	if tc.killGuard {
		if err := syscall.Kill(guard, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := syscall.Kill(guard, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(guard, syscall.SIGCONT) })
	}
	if !tc.cut && !tc.killGuard {
		if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	if !standby {
		holder.wait(t, 30*time.Second)
		checkNoLateEscapee(t, file, attacked, time.Now().UnixNano(), "baton exited")
		return
	}
	// The next command: the standby's, or with cron and a killed guard,
	// the same holder's next run.
	var next event
	testkit.Eventually(t, 30*time.Second, "the next command to start", func() bool {
		for _, s := range starts(readEvents(file)) {
			if !attacked[s.pid] {
				next = s
				return true
			}
		}
		return false
	})
	// A second of the new command, for a survivor to show itself.
	testkit.Eventually(t, 10*time.Second, "the new command's heartbeats", func() bool { return heartbeatsOf(file, next.pid) >= 20 })
	if next.others != 0 {
		t.Errorf("the next command started while %d processes of earlier ones were alive", next.others)
	}
	checkNoLateEscapee(t, file, attacked, next.at, "the next command started")
}

// TestRunGuardResumed is the attack of a guard stopped alone (SIGSTOP of its
// pid) for longer than the TTL while baton goes on renewing: resumed, the
// guard must read the extensions baton queued in its socket before it
// judges the deadline, and leave the command running; the term goes on.
func TestRunGuardResumed(t *testing.T) {
	t.Parallel()
	file, self := sharedEventFile(t)
	killLeftoverChildren(t, file)
	const ttl = 2 * time.Second
	holder := startUnprivilegedBaton(t, "baton", testEnv(childEnv+"=hb", childFileEnv+"="+file),
		"run", "--backend", "memory://", "--lease", "resumed-guard", "--ttl", ttl.String(), "--log-level", "debug", "--", self)
	testkit.Eventually(t, 30*time.Second, "the command to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	child := starts(readEvents(file))[0]
	guard := guardOf(t, child.pid)
	if err := syscall.Kill(guard, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(guard, syscall.SIGCONT) })
	// The stop is the attack: it must outlast the TTL.
	time.Sleep(ttl + ttl/2)
	if err := syscall.Kill(guard, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now().UnixNano()
	testkit.Eventually(t, 10*time.Second, "a second of heartbeats after the resume", func() bool {
		n := 0
		for _, e := range readEvents(file) {
			if e.pid == child.pid && e.kind == "hb" && e.at > resumed {
				n++
			}
		}
		return n >= 20 || !alive(child.pid)
	})
	if !alive(child.pid) {
		t.Fatalf("the resumed guard killed the command of a term that went on")
	}
	if _, ok := stopOf(readEvents(file), child.pid); ok {
		t.Errorf("the resumed guard stopped the command of a term that went on")
	}
	if n := len(starts(readEvents(file))); n != 1 {
		t.Errorf("%d commands started, want 1: the term was lost", n)
	}
	select {
	case <-holder.done:
		t.Errorf("baton exited: %v", holder.cmd.ProcessState)
	default:
	}
}
