//go:build linux && !batonpgroup

package supervise

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/proctree"
	"github.com/batonhq/baton/internal/testkit"
)

const testTimeout = 10 * time.Second

// start starts cfg and makes sure the child's group is gone when the test ends.
func start(t *testing.T, cfg Config) *Process {
	t.Helper()
	p, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start(%q): %v", cfg.Command, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
	return p
}

// lines gives the child a stdout pipe and returns a channel of its lines, so
// tests can wait for the child to announce it is ready (e.g. traps are set).
func lines(t *testing.T, cfg *Config) <-chan string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Stdout = w
	ch := make(chan string, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		w.Close()
		r.Close()
		wg.Wait()
	})
	return ch
}

func expectLine(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	select {
	case got, ok := <-ch:
		if !ok {
			t.Fatalf("child output closed, want %q", want)
		}
		if got != want {
			t.Fatalf("child printed %q, want %q", got, want)
		}
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for child to print %q", want)
	}
}

// startLooping starts a shell that sets trap (`trap "" TERM`), prints
// "ready" and loops until it is stopped, with grace for Config.Grace, and
// returns once the trap is set, with the channel of the lines it prints next.
func startLooping(t *testing.T, trap string, grace time.Duration) (*Process, <-chan string) {
	t.Helper()
	cfg := Config{
		Command: []string{"sh", "-c", trap + "; echo ready; while :; do sleep 0.1; done"},
		Grace:   grace,
	}
	out := lines(t, &cfg)
	p := start(t, cfg)
	expectLine(t, out, "ready")
	return p, out
}

func waitDone(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(testTimeout):
		t.Fatalf("child %d did not exit", p.Pid())
	}
}

func stop(t *testing.T, p *Process) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	t0 := time.Now()
	err := p.Stop(ctx)
	return time.Since(t0), err
}

// dead reports whether pid is gone or a zombie; in containers PID 1 may never
// reap orphaned zombies.
func dead(pid int) bool {
	_, ok := proctree.Read(pid)
	return !ok
}

func waitDead(t *testing.T, pid int) {
	t.Helper()
	testkit.Eventually(t, testTimeout, fmt.Sprintf("process %d to die", pid), func() bool { return dead(pid) })
}

// readPid polls path until it holds a pid written by a child.
func readPid(t *testing.T, path string) int {
	t.Helper()
	var b []byte
	testkit.Eventually(t, testTimeout, "a pid in "+path, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil && bytes.HasSuffix(b, []byte("\n"))
	})
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("bad pid file %s: %q", path, b)
	}
	return pid
}

func TestExitCode(t *testing.T) {
	p := start(t, Config{Command: []string{"sh", "-c", "exit 7"}})
	waitDone(t, p)
	if got := p.ExitCode(); got != 7 {
		t.Errorf("ExitCode = %d, want 7", got)
	}
	if err := p.Err(); err == nil || !strings.Contains(err.Error(), "status 7") {
		t.Errorf("Err = %v, want an error naming status 7", err)
	}
}

func TestExitCodeZero(t *testing.T) {
	p := start(t, Config{Command: []string{"true"}})
	waitDone(t, p)
	if p.ExitCode() != 0 || p.Err() != nil {
		t.Errorf("ExitCode, Err = %d, %v; want 0, nil", p.ExitCode(), p.Err())
	}
}

func TestExitCodeKilledBySignal(t *testing.T) {
	p := start(t, Config{Command: []string{"sh", "-c", "kill -KILL $$"}})
	waitDone(t, p)
	if got, want := p.ExitCode(), 128+int(syscall.SIGKILL); got != want {
		t.Errorf("ExitCode = %d, want %d", got, want)
	}
}

func TestSignal(t *testing.T) {
	p := start(t, Config{Command: []string{"sleep", "1000"}})
	if got := p.ExitCode(); got != -1 {
		t.Errorf("ExitCode while running = %d, want -1", got)
	}
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	waitDone(t, p)
	if got, want := p.ExitCode(), 128+int(syscall.SIGUSR1); got != want {
		t.Errorf("ExitCode = %d, want %d", got, want)
	}
	if err := p.Signal(syscall.SIGUSR1); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal after exit = %v, want os.ErrProcessDone", err)
	}
}

func TestStopGraceful(t *testing.T) {
	p, _ := startLooping(t, `trap "exit 0" TERM`, testTimeout)

	took, err := stop(t, p)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if p.ExitCode() != 0 {
		t.Errorf("ExitCode = %d, want 0 (trap should exit on SIGTERM)", p.ExitCode())
	}
	if took >= testTimeout {
		t.Errorf("Stop took %v; SIGTERM should have sufficed", took)
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	const grace = 200 * time.Millisecond
	p, _ := startLooping(t, `trap "" TERM`, grace)

	took, err := stop(t, p)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got, want := p.ExitCode(), 128+int(syscall.SIGKILL); got != want {
		t.Errorf("ExitCode = %d, want %d", got, want)
	}
	if took < grace {
		t.Errorf("Stop took %v, less than grace %v", took, grace)
	}
}

func TestStopContextEscalates(t *testing.T) {
	p, _ := startLooping(t, `trap "" TERM`, time.Hour)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want context.DeadlineExceeded", err)
	}
	if got, want := p.ExitCode(), 128+int(syscall.SIGKILL); got != want {
		t.Errorf("ExitCode = %d, want %d", got, want)
	}
}

func TestStopConcurrentAndIdempotent(t *testing.T) {
	p := start(t, Config{Command: []string{"sleep", "1000"}})
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Go(func() { _, errs[i] = stop(t, p) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Stop #%d: %v", i, err)
		}
	}
	if _, err := stop(t, p); err != nil {
		t.Errorf("Stop after stop: %v", err)
	}
	if got, want := p.ExitCode(), 128+int(syscall.SIGTERM); got != want {
		t.Errorf("ExitCode = %d, want %d", got, want)
	}
}

func TestStopKillsGrandchild(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := start(t, Config{
		Command: []string{"sh", "-c", `sleep 1000 & echo $! > "$1"; wait`, "sh", pidFile},
	})
	grandchild := readPid(t, pidFile)
	if dead(grandchild) {
		t.Fatalf("grandchild %d not running", grandchild)
	}
	if _, err := stop(t, p); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	waitDead(t, grandchild)
}

// TestStopKillsOrphanThatIgnoresTERM covers a group member that outlives the
// leader and ignores SIGTERM: Stop must still wait out the grace period for
// it and then SIGKILL the group.
func TestStopKillsOrphanThatIgnoresTERM(t *testing.T) {
	const grace = 200 * time.Millisecond
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := start(t, Config{
		Command: []string{"sh", "-c", `(trap "" TERM; exec sleep 1000) & echo $! > "$1"`, "sh", pidFile},
		Grace:   grace,
	})
	waitDone(t, p) // the leader exits by itself, leaving the orphan behind
	orphan := readPid(t, pidFile)
	if dead(orphan) {
		t.Fatalf("orphan %d not running", orphan)
	}
	took, err := stop(t, p)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if took < grace {
		t.Errorf("Stop took %v, less than grace %v", took, grace)
	}
	waitDead(t, orphan)
}

func TestEnv(t *testing.T) {
	var out bytes.Buffer
	p := start(t, Config{
		Command: []string{"sh", "-c", `printf %s "$BATON_TEST_VAR$` + guardEnv + `"`},
		Env:     []string{"PATH=" + os.Getenv("PATH"), "BATON_TEST_VAR=hello baton"},
		Stdout:  &out,
	})
	waitDone(t, p)
	// The guard's exit, which Stop waits for, ends the copying of out.
	if _, err := stop(t, p); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "hello baton" {
		t.Errorf("child saw BATON_TEST_VAR$%s=%q, want %q (the guard's marker removed)", guardEnv, got, "hello baton")
	}
}

func TestCommandNotFound(t *testing.T) {
	_, err := Start(Config{Command: []string{"baton-no-such-command-7f3a"}})
	if err == nil {
		t.Fatal("Start succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "baton-no-such-command-7f3a") || !strings.Contains(msg, "PATH") {
		t.Errorf("error %q should name the command and mention PATH", msg)
	}
	if !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("error %v should wrap exec.ErrNotFound", err)
	}
}

func TestCommandNotExecutable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Start(Config{Command: []string{path}})
	if err == nil {
		t.Fatal("Start succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "not executable") {
		t.Errorf("error %q should name the command and say it is not executable", msg)
	}
}

func TestInvalidConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no command":     {},
		"empty command":  {Command: []string{""}},
		"negative grace": {Command: []string{"true"}, Grace: -time.Second},
	} {
		if _, err := Start(cfg); err == nil {
			t.Errorf("%s: Start succeeded", name)
		}
	}
}

func TestForward(t *testing.T) {
	p, out := startLooping(t, `trap "echo got-usr2" USR2`, 0)

	stopForward := p.Forward(context.Background(), syscall.SIGUSR2)
	defer stopForward()
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	expectLine(t, out, "got-usr2")
	stopForward()
	stopForward() // idempotent
}

func TestForwardStopsWithContext(t *testing.T) {
	p := start(t, Config{Command: []string{"sleep", "1000"}})
	ctx, cancel := context.WithCancel(context.Background())
	stopForward := p.Forward(ctx)
	cancel()
	finished := make(chan struct{})
	go func() { stopForward(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(testTimeout):
		t.Fatal("stop did not return after context was cancelled")
	}
}

// preparedPid returns the pid of the guard Prepare started, or 0.
func preparedPid() int {
	spare.mu.Lock()
	defer spare.mu.Unlock()
	if spare.p == nil {
		return 0
	}
	return spare.p.guard.Process.Pid
}

// A guard started by Prepare runs the next command whose streams are its
// own, with the command's own arguments and environment; one killed while
// it waited is replaced; Discard ends one not taken.
func TestPrepare(t *testing.T) {
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	t.Cleanup(Discard)

	if err := Prepare(nil, out, nil); err != nil {
		t.Fatal(err)
	}
	want := preparedPid()
	p := start(t, Config{Command: []string{"sh", "-c", `echo "$0 $BATON_TEST_VALUE"`, "arg"}, Env: []string{"BATON_TEST_VALUE=value"}, Stdout: out})
	if got := p.guard.Process.Pid; got != want {
		t.Errorf("the command runs under guard %d, not the prepared %d", got, want)
	}
	waitDone(t, p)
	if b, _ := os.ReadFile(out.Name()); string(b) != "arg value\n" {
		t.Errorf("the command printed %q, want %q", b, "arg value\n")
	}

	// Other streams: a guard of its own; the prepared one stays.
	if err := Prepare(nil, out, nil); err != nil {
		t.Fatal(err)
	}
	kept := preparedPid()
	q := start(t, Config{Command: []string{"true"}})
	if q.guard.Process.Pid == kept || preparedPid() != kept {
		t.Errorf("a command with other streams took the prepared guard %d", kept)
	}

	// Killed while it waited: Start starts another.
	if err := syscall.Kill(kept, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := start(t, Config{Command: []string{"true"}, Stdout: out})
	waitDone(t, r)
	if r.ExitCode() != 0 {
		t.Errorf("after the prepared guard was killed, the command's exit code is %d", r.ExitCode())
	}

	if err := Prepare(nil, out, nil); err != nil {
		t.Fatal(err)
	}
	left := preparedPid()
	Discard()
	if !dead(left) {
		t.Errorf("the discarded guard %d still runs", left)
	}
	if err := Prepare(nil, &bytes.Buffer{}, nil); err == nil {
		t.Error("Prepare took a stream that is not a file")
	}
}

// A prepared guard that is told to stop (SIGTERM) while it waits for a
// command ends without starting one and leaves no cgroup behind; the next
// Start starts a guard of its own. One given a command that asks for no
// cgroup removes the one it made while it waited.
func TestPreparedGuardStoppedOrWithoutCgroup(t *testing.T) {
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	t.Cleanup(Discard)
	cgroupOf := func(guard int) string {
		cg := newCgroup()
		if cg == nil {
			t.Log(whyNoCgroup(t))
			return "" // the cgroup half of the test has nothing to check
		}
		cg.remove()
		return filepath.Join(filepath.Dir(cg.dir), guardCgroupPrefix+strconv.Itoa(guard))
	}

	if err := Prepare(nil, out, nil); err != nil {
		t.Fatal(err)
	}
	waiting := preparedPid()
	dir := cgroupOf(waiting)
	if dir != "" {
		testkit.Eventually(t, testTimeout, "the waiting guard's cgroup "+dir, func() bool {
			_, err := os.Stat(dir)
			return err == nil
		})
	}
	if err := syscall.Kill(waiting, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitDead(t, waiting)
	if dir != "" {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the stopped guard left its cgroup %s: %v", dir, err)
		}
	}
	p := start(t, Config{Command: []string{"sh", "-c", "echo ran"}, Stdout: out})
	waitDone(t, p)
	if p.guard.Process.Pid == waiting || p.ExitCode() != 0 {
		t.Errorf("after the prepared guard was stopped: guard %d (the stopped one: %d), exit code %d", p.guard.Process.Pid, waiting, p.ExitCode())
	}
	if b, _ := os.ReadFile(out.Name()); string(b) != "ran\n" {
		t.Errorf("the command printed %q, want %q", b, "ran\n")
	}

	if err := Prepare(nil, out, nil); err != nil {
		t.Fatal(err)
	}
	spareGuard := preparedPid()
	dir = cgroupOf(spareGuard)
	q := start(t, Config{Command: []string{"sleep", "1000"}, Stdout: out, DisableCgroup: true})
	if q.guard.Process.Pid != spareGuard {
		t.Fatalf("the command runs under guard %d, not the prepared %d", q.guard.Process.Pid, spareGuard)
	}
	if q.cgroup != "" {
		t.Errorf("a command started with DisableCgroup runs in cgroup %s", q.cgroup)
	}
	if dir != "" {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the guard of a command without a cgroup kept the one it made while it waited, %s: %v", dir, err)
		}
	}
	if _, err := stop(t, q); err != nil {
		t.Fatal(err)
	}
}
