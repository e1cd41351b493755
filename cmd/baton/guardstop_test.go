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

// checkNoLateEscapee fails t if a process of the term with token acted at or
// after at, or still runs.
func checkNoLateEscapee(t *testing.T, file string, token uint64, at int64, what string) {
	t.Helper()
	var late []event
	for _, e := range readEvents(file) {
		if e.token == token && e.at >= at {
			late = append(late, e)
		}
	}
	if len(late) > 0 {
		last := late[len(late)-1]
		t.Errorf("processes of the term with token %d acted %d times after %s, the last (process %d) %s after",
			token, len(late), what, last.pid, time.Duration(last.at-at).Round(time.Millisecond))
	}
	for _, e := range starts(readEvents(file)) {
		if e.token == token && alive(e.pid) {
			t.Errorf("process %d of the term with token %d still runs after %s", e.pid, token, what)
		}
	}
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
	for _, tc := range []struct {
		name    string
		cron    bool
		memory  bool
		cut     bool
		standby bool
	}{
		{name: "etcd/SIGTERM", standby: true},
		{name: "etcd/cut", cut: true, standby: true},
		{name: "memory/SIGTERM", memory: true},
		{name: "cron/etcd/SIGTERM", cron: true, standby: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file, self := sharedEventFile(t)
			killLeftoverChildren(t, file)
			env := testEnv(childEnv+"=hb", childFileEnv+"="+file, ignoreTermEnv+"=1")
			var srv *testserver.Etcd
			if !tc.memory {
				srv = testserver.StartEtcd(t)
			}
			n := 1
			if tc.standby {
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
				args = append(args, "--backend", backend, "--lease", "stopped-guard", "--ttl", "4s", "--grace", "500ms",
					"--log-level", "debug", "--", "sh", "-c", escapingJob, self)
				procs = append(procs, startUnprivilegedBaton(t, fmt.Sprintf("baton-%d", i+1), env, args...))
			}
			testkit.Eventually(t, 30*time.Second, "both grandchildren to start", func() bool { return len(starts(readEvents(file))) >= 2 })
			first := starts(readEvents(file))[0]
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
			if err := syscall.Kill(guard, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(guard, syscall.SIGCONT) })
			if !tc.cut {
				if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.standby {
				holder.wait(t, 30*time.Second)
				checkNoLateEscapee(t, file, first.token, time.Now().UnixNano(), "baton exited")
				return
			}
			testkit.Eventually(t, 30*time.Second, "the standby's command to start", func() bool {
				for _, s := range starts(readEvents(file)) {
					if s.token > first.token {
						return true
					}
				}
				return false
			})
			var next event
			for _, s := range starts(readEvents(file)) {
				if s.token > first.token {
					next = s
					break
				}
			}
			// A second of the new term, for a survivor to show itself.
			testkit.Eventually(t, 10*time.Second, "the new term's heartbeats", func() bool { return heartbeatsOf(file, next.pid) >= 20 })
			if next.others != 0 {
				t.Errorf("the new term's command started while %d processes of earlier terms were alive", next.others)
			}
			checkNoLateEscapee(t, file, first.token, next.at, "the next holder's command started")
		})
	}
}
