package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// batonProc is a baton process started by a test.
type batonProc struct {
	name string
	cmd  *exec.Cmd
	out  *testserver.SyncBuffer // stdout and stderr
	done chan struct{}
}

// testEnv is this process's environment without BATON_* variables, which
// would change what the commands under test do, plus extra.
func testEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BATON_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// startBaton starts the baton binary; it is killed with SIGKILL at the end
// of the test if it is still running, and its output is logged if the test
// failed.
func startBaton(t testing.TB, name string, env []string, args ...string) *batonProc {
	t.Helper()
	return startBatonAttr(t, name, env, false, args...)
}

// startBatonAttr is startBaton, with baton in a process group of its own
// if setpgid.
func startBatonAttr(t testing.TB, name string, env []string, setpgid bool, args ...string) *batonProc {
	t.Helper()
	p := &batonProc{name: name, out: new(testserver.SyncBuffer), done: make(chan struct{})}
	p.cmd = exec.Command(batonBin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// A descendant that escaped baton would hold the output pipe open and
	// keep Wait, and so the test, from ever ending.
	p.cmd.WaitDelay = 5 * time.Second
	// Should the test binary die, its batons (and through them their
	// children) must not linger.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: setpgid}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped baton dies only once it runs
		<-p.done
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", name, strings.Join(args, " "), p.out)
		}
	})
	return p
}

// wait waits for p to exit and returns its exit status.
func (p *batonProc) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.name, timeout)
		return -1
	}
}

// runBaton runs the baton binary to completion.
func runBaton(t testing.TB, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	var stdout, stderr testserver.SyncBuffer
	cmd := exec.CommandContext(ctx, batonBin, args...)
	cmd.Env = testEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("baton %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("baton %s did not finish within %s; stderr:\n%s", strings.Join(args, " "), timeout, stderr.String())
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

func starts(evs []event) []event {
	var s []event
	for _, e := range evs {
		if e.kind == "start" {
			s = append(s, e)
		}
	}
	return s
}

func stopOf(evs []event, pid int) (event, bool) {
	for _, e := range evs {
		if e.kind == "stop" && e.pid == pid {
			return e, true
		}
	}
	return event{}, false
}

// killLeftoverChildren kills, at the end of a test, any child in file that
// still runs: a failing test must not leave them behind.
func killLeftoverChildren(t testing.TB, file string) {
	t.Cleanup(func() {
		// The batons are gone by now (their cleanups ran first); their
		// guards stop the children within --grace.
		deadline := time.Now().Add(5 * time.Second)
		for _, e := range starts(readEvents(file)) {
			if !testkit.Poll(time.Until(deadline), 10*time.Millisecond, func() bool { return !isOurChild(e.pid) }) {
				t.Errorf("child %d (token %d) outlived its baton", e.pid, e.token)
				_ = syscall.Kill(e.pid, syscall.SIGKILL)
			}
		}
	})
}

// leaderProc returns the baton process that pid descends from (baton, its
// command's guard, the command, and possibly a wrapper script between).
func leaderProc(t *testing.T, procs []*batonProc, pid int) *batonProc {
	t.Helper()
	p := procOf(procs, pid)
	if p == nil {
		t.Fatalf("child %d is gone, or descends from none of the batons", pid)
	}
	return p
}

// procOf returns the baton process that pid descends from, as leaderProc
// does, or nil when pid or an ancestor on the way is gone, or it descends
// from none of procs.
func procOf(procs []*batonProc, pid int) *batonProc {
	for anc, n := pid, 0; n < 5; n++ {
		_, ppid, ok := procStat(anc)
		if !ok {
			return nil
		}
		for _, p := range procs {
			if p.cmd.Process.Pid == ppid {
				return p
			}
		}
		anc = ppid
	}
	return nil
}

// TestRunFailover runs three `baton run` against each backend with a real
// server: a crash of the leader, then a SIGTERM, and the standbys take over
// in turn, never two children at once.
func TestRunFailover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) string
		ttl     string
	}{
		{"etcd", func(t *testing.T) string { return etcdURL(t) }, "1s"},
		{"zookeeper", func(t *testing.T) string { return zkURL(t, "/services/failover") }, "2s"}, // a renewal window (0.6 s) that --grace 300ms fits in
		// Consul's session TTL is TTL/2 (the test agent allows 1 s),
		// renewed every TTL/4: a renewal window (0.45 s) that --grace
		// 300ms fits in.
		{"consul", func(t *testing.T) string { return consulURL(t, "/services") }, "3s"},
		// Lease durations are whole seconds; at 2 s a renewal (every
		// 0.67 s) delayed by the loaded test server does not look like a
		// dead holder, and the renewal window (1.1 s) fits --grace 300ms.
		{"kubernetes", func(t *testing.T) string { return k8sURL(t, "failover") }, "2s"},
		// A renewal window of 1.1 s at 2 s, which --grace 300ms fits in.
		{"postgres", pgURL, "2s"},
		// Through PgBouncer in transaction-pooling mode: waiters poll.
		{"pgbouncer", pgBouncerURL, "2s"},
		// Renewal window 1.1 s at 2 s; waiters wake by pub/sub.
		{"redis", redisURL, "2s"},
		// Every acquisition and renewal waits for the replica (WAIT).
		{"redis-sentinel", redisSentinelURL, "2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testRunFailover(t, tc.backend(t), tc.ttl)
		})
	}
}

func testRunFailover(t *testing.T, backend, ttl string, extraEnv ...string) {
	const lease = "failover"
	file := filepath.Join(t.TempDir(), "events")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	killLeftoverChildren(t, file)
	env := testEnv(append([]string{childEnv + "=1", childFileEnv + "=" + file}, extraEnv...)...)
	var procs []*batonProc
	for i := range 3 {
		procs = append(procs, startBaton(t, fmt.Sprintf("baton-%d", i+1), env,
			"run", "--backend", backend, "--lease", lease, "--ttl", ttl, "--grace", "300ms", "--log-level", "debug", "--", self))
	}

	testkit.Eventually(t, 30*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	if first.others != 0 {
		t.Errorf("first child started with %d others alive", first.others)
	}
	leader := leaderProc(t, procs, first.pid)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first.holder, host+"/") {
		t.Errorf("default id %q should be HOST/SUFFIX with HOST %q", first.holder, host)
	}

	t.Run("queries", func(t *testing.T) {
		q := []string{"--backend", backend, "--lease", lease, "--timeout", "10s"}
		if r := runBatonEnv(t, 30*time.Second, testEnv(extraEnv...), append([]string{"is-leader", "--id", first.holder}, q...)...); r.code != 0 || r.stdout != "" {
			t.Errorf("is-leader --id <holder>: exit %d, stdout %q, stderr %q; want 0 and no output", r.code, r.stdout, r.stderr)
		}
		if r := runBatonEnv(t, 30*time.Second, testEnv(extraEnv...), append([]string{"is-leader", "--id", host + "/other"}, q...)...); r.code != 1 {
			t.Errorf("is-leader --id <other>: exit %d, want 1; stderr %q", r.code, r.stderr)
		}
		// Without --id, any holder on this host is "this instance".
		if r := runBatonEnv(t, 30*time.Second, testEnv(extraEnv...), append([]string{"is-leader", "--verbose"}, q...)...); r.code != 0 || !strings.HasPrefix(r.stdout, "leader: holder="+first.holder) {
			t.Errorf("is-leader without --id on the leader's host: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		r := runBatonEnv(t, 30*time.Second, testEnv(extraEnv...), append([]string{"leader", "--json"}, q...)...)
		var got struct {
			Lease  string  `json:"lease"`
			Holder *string `json:"holder"`
			Token  uint64  `json:"token,string"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 0 {
			t.Fatalf("leader --json: exit %d, stdout %q (%v), stderr %q", r.code, r.stdout, err, r.stderr)
		}
		if got.Lease != lease || got.Holder == nil || *got.Holder != first.holder || got.Token != first.token {
			t.Errorf("leader --json = %s, want lease %q holder %q token %d", r.stdout, lease, first.holder, first.token)
		}
		r = runBatonEnv(t, 30*time.Second, testEnv(extraEnv...), append([]string{"leader"}, q...)...)
		// since= follows on the backends that record when the term began.
		want := fmt.Sprintf("holder=%s token=%d", first.holder, first.token)
		if rest, ok := strings.CutPrefix(r.stdout, want); r.code != 0 || !ok || (rest != "\n" && !strings.HasPrefix(rest, " since=")) {
			t.Errorf("leader: exit %d, stdout %q, want %q [since=...]", r.code, r.stdout, want)
		}
		// The lease is taken, so a bounded wait ends with 3.
		r = runBatonEnv(t, 30*time.Second, testEnv(extraEnv...), "run", "--backend", backend, "--lease", lease, "--timeout", "500ms", "--", "true")
		if r.code != exitUndetermined || !strings.Contains(r.stderr, "not elected within --timeout") {
			t.Errorf("run --timeout on a held lease: exit %d, want 3; stderr:\n%s", r.code, r.stderr)
		}
	})

	// A crash: the leader's command must die with it, and a standby's start
	// only once it is gone.
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	leader.wait(t, 10*time.Second)
	testkit.Eventually(t, 10*time.Second, "the crashed leader's child to die (its guard stops it)", func() bool { return !alive(first.pid) })
	testkit.Eventually(t, 30*time.Second, "a standby's child to start after the crash", func() bool { return len(starts(readEvents(file))) >= 2 })
	second := starts(readEvents(file))[1]
	if second.token <= first.token {
		t.Errorf("token after the crash %d, want more than %d", second.token, first.token)
	}
	if second.others != 0 {
		t.Errorf("a child started while %d others were alive", second.others)
	}

	// A shutdown: SIGTERM stops the command, then resigns; exit 0.
	leader = leaderProc(t, procs, second.pid)
	if err := leader.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := leader.wait(t, 30*time.Second); code != 0 {
		t.Errorf("baton exited %d after SIGTERM, want 0", code)
	}
	stop, ok := stopOf(readEvents(file), second.pid)
	if !ok {
		t.Fatal("the stopped leader's child did not get SIGTERM (no stop line)")
	}
	testkit.Eventually(t, 30*time.Second, "the last standby's child to start after the hand-over", func() bool { return len(starts(readEvents(file))) >= 3 })
	third := starts(readEvents(file))[2]
	if third.at < stop.at {
		t.Errorf("a child started at %d, before its predecessor stopped at %d", third.at, stop.at)
	}

	// Every start follows its predecessor's stop, if that one had a chance
	// to write it, and tokens strictly increase.
	evs := readEvents(file)
	ss := starts(evs)
	for i, s := range ss {
		if s.others != 0 {
			t.Errorf("child %d (token %d) started while %d others were alive", s.pid, s.token, s.others)
		}
		if i == 0 {
			continue
		}
		prev := ss[i-1]
		if s.token <= prev.token {
			t.Errorf("tokens do not increase: %d then %d", prev.token, s.token)
		}
		if st, ok := stopOf(evs, prev.pid); ok && s.at < st.at {
			t.Errorf("child with token %d started before the one with token %d stopped", s.token, prev.token)
		}
	}
}

func TestRunOnce(t *testing.T) {
	t.Parallel()
	srv := testserver.StartEtcd(t)
	backend := "etcd://" + srv.Endpoint()

	r := runBaton(t, 60*time.Second, "run", "--once", "--backend", backend, "--lease", "once", "--", "sh", "-c", "exit 7")
	if r.code != 7 {
		t.Errorf("run --once -- sh -c 'exit 7': exit %d; stderr:\n%s", r.code, r.stderr)
	}

	// Losing the lease (here: an operator deletes the key) stops the
	// command and exits 4.
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := startBaton(t, "baton-once", testEnv(childEnv+"=1", childFileEnv+"="+file),
		"run", "--once", "--backend", backend, "--lease", "lost", "--ttl", "2s", "--grace", "500ms", "--", self)
	testkit.Eventually(t, 30*time.Second, "the child to start", func() bool { return len(starts(readEvents(file))) == 1 })
	client := etcdClient(t, srv.Endpoint())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := client.Delete(ctx, "lost/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != exitLost {
		t.Errorf("run --once after the lease was lost: exit %d, want %d", code, exitLost)
	}
	if _, ok := stopOf(readEvents(file), starts(readEvents(file))[0].pid); !ok {
		t.Error("the command was not stopped with SIGTERM when the lease was lost")
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestUnreachableBackend(t *testing.T) {
	t.Parallel()
	for _, scheme := range []string{"etcd", "zk", "consul"} {
		t.Run(scheme, func(t *testing.T) {
			t.Parallel()
			testUnreachableBackend(t, scheme+"://"+closedPort(t))
		})
	}
}

func testUnreachableBackend(t *testing.T, backend string) {
	t.Run("is-leader", func(t *testing.T) {
		t.Parallel()
		const timeout = time.Second
		start := time.Now()
		r := runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "x", "--timeout", timeout.String())
		took := time.Since(start)
		if r.code != exitUndetermined {
			t.Errorf("exit %d, want 3; stderr %q", r.code, r.stderr)
		}
		// Either the client waits for a connection until the timeout
		// (etcd, ZooKeeper) or it is refused at once (Consul's HTTP).
		if !strings.Contains(r.stderr, "no answer from "+backend+" within --timeout 1s") &&
			!(strings.Contains(r.stderr, "asking "+backend) && strings.Contains(r.stderr, "connection refused")) {
			t.Errorf("stderr should say the backend did not answer: %q", r.stderr)
		}
		// A bound, not a speed test: the answer comes at the timeout, not
		// at some later dial or retry timeout.
		if took > timeout+5*time.Second {
			t.Errorf("took %s with --timeout %s", took, timeout)
		}
	})
	t.Run("leader", func(t *testing.T) {
		t.Parallel()
		r := runBaton(t, 30*time.Second, "leader", "--json", "--backend", backend, "--lease", "x", "--timeout", "500ms")
		if r.code != exitUndetermined || r.stdout != "" {
			t.Errorf("exit %d (want 3), stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("run", func(t *testing.T) {
		t.Parallel()
		r := runBaton(t, 30*time.Second, "run", "--backend", backend, "--lease", "x", "--timeout", "4s", "--", "true")
		if r.code != exitUndetermined {
			t.Errorf("exit %d, want 3; stderr:\n%s", r.code, r.stderr)
		}
		// A standby reports the backend as unreachable, or (ZooKeeper,
		// whose session comes first) the start-up says it could not connect.
		if !strings.Contains(r.stderr, "backend unreachable") && !strings.Contains(r.stderr, "could not connect to the backend") {
			t.Errorf("a standby should report the unreachable backend; stderr:\n%s", r.stderr)
		}
	})
}
