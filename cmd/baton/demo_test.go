package main

import (
	"context"
	"fmt"
	"io/fs"
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

func TestDemo(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	var stdout, stderr testserver.SyncBuffer
	cmd := exec.CommandContext(ctx, batonBin, "demo", "--nodes", "3", "--rounds", "2", "--ttl", "2.5s", "--interval", "300ms")
	cmd.Env = testEnv("TMPDIR=" + tmp)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
	if err != nil || r.code != 0 {
		t.Fatalf("demo: %v; stdout:\n%s\nstderr:\n%s", err, r.stdout, r.stderr)
	}
	for _, want := range []string{"kill -9 node-", "— failover ", "SIGTERM node-", "— hand-over ", "summary (done): 2 kill(s)",
		"crash failover (kill -9):      1×", "graceful hand-over (SIGTERM):  1×"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
	if n := strings.Count(r.stdout, " leads (token "); n < 3 {
		t.Errorf("%d 'leads' lines, want at least 3 (first leader and two failovers):\n%s", n, r.stdout)
	}
	if orphans := demoProcesses(tmp); len(orphans) > 0 {
		t.Errorf("processes left behind by the demo: %v", orphans)
	}
}

// demoProcesses lists live processes of the baton binary running demo nodes
// or jobs of the demo started with TMPDIR=tmp (so that demos of tests
// running in parallel are told apart).
func demoProcesses(tmp string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || !alive(pid) {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !strings.Contains("\x00"+string(env), "\x00TMPDIR="+tmp+"\x00") {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		cmdline := strings.Join(args, " ")
		if args[0] == batonBin && (strings.Contains(cmdline, "--lease demo") || strings.Contains(cmdline, "demo-job")) {
			found = append(found, fmt.Sprintf("%d: %s", pid, cmdline))
		}
	}
	return found
}

// startDemo starts `baton demo` with its temporary files under a directory
// of the test's, and waits until a node leads.
func startDemo(t *testing.T, flags ...string) (*batonProc, string) {
	t.Helper()
	tmp := t.TempDir()
	args := append([]string{"demo", "--nodes", "3", "--rounds", "5", "--ttl", "2.5s", "--interval", "1h"}, flags...)
	p := startBaton(t, "demo", testEnv("TMPDIR="+tmp), args...)
	testkit.Eventually(t, 60*time.Second, "a node to lead", func() bool { return strings.Contains(p.out.String(), " leads (token ") })
	return p, tmp
}

// keyFiles lists the files under dir named like a private key (ca-key.pem,
// node-1-key.pem): the demo's nodes make their keys in memory.
func keyFiles(t *testing.T, dir string) []string {
	t.Helper()
	var found []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		name := d.Name()
		if strings.Contains(name, "key") {
			found = append(found, path)
		}
		return nil
	})
	return found
}

// TestDemoInterruptIsPrompt: SIGINT stops the demo and its nodes without
// waiting out any close timeout (5s each: the nodes' leave, the observer's),
// and the demo never writes a key to disk (there is no CA; each node makes
// its own key in memory).
func TestDemoInterruptIsPrompt(t *testing.T) {
	t.Parallel()
	// --verbose: a slow stop shows in the nodes' logs, printed on failure.
	p, tmp := startDemo(t, "--verbose")
	if keys := keyFiles(t, tmp); len(keys) > 0 {
		t.Errorf("the running demo has keys on disk: %v", keys)
	}
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("demo exited %d after SIGINT, want 0", code)
	}
	// The bound is what "prompt" means here: below two close timeouts
	// (5 s each) waited out in a row.
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("demo took %s to stop after SIGINT", took.Round(time.Millisecond))
	}
	if !strings.Contains(p.out.String(), "summary (interrupted)") {
		t.Errorf("no summary after SIGINT:\n%s", p.out)
	}
	if orphans := demoProcesses(tmp); len(orphans) > 0 {
		t.Errorf("processes left behind by the demo: %v", orphans)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) > 0 {
		t.Errorf("the demo left %d entries in its temporary directory", len(entries))
	}
}

// TestDemoKilledLeavesNoCAKey: a demo killed outright (kill -9) cannot
// clean up; what it leaves must not include a private key (a CA's would
// let anyone on the host mint certificates; the demo has none, and its
// nodes keep theirs in memory).
func TestDemoKilledLeavesNoCAKey(t *testing.T) {
	t.Parallel()
	p, tmp := startDemo(t)
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 30*time.Second)
	testkit.Eventually(t, 30*time.Second, "the nodes to die with the demo", func() bool { return len(demoProcesses(tmp)) == 0 })
	if keys := keyFiles(t, tmp); len(keys) > 0 {
		t.Errorf("a killed demo left keys on disk: %v", keys)
	}
}
