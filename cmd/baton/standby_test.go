package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestRunStandbyReportsLeader: a standby logs who leads ("standing by")
// from the backend's watch, and again when that changes: b and c stand by
// behind a; when a stops, one of them takes over and the other reports it.
func TestRunStandbyReportsLeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) string
		ttl     string
	}{
		{"etcd", func(t *testing.T) string { return etcdURL(t) }, "2s"},
		{"zookeeper", func(t *testing.T) string { return zkURL(t, "/services/standby") }, "4s"},
		{"consul", func(t *testing.T) string { return consulURL(t, "/services") }, "4s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			backend := tc.backend(t)
			start := func(id string) *batonProc {
				return startBaton(t, id, testEnv(), "run", "--backend", backend, "--lease", "standby", "--id", id,
					"--ttl", tc.ttl, "--", "sleep", "600")
			}
			standingBy := func(p *batonProc, from int, leader string) {
				t.Helper()
				testkit.Eventually(t, 30*time.Second, p.name+" standing by behind "+leader, func() bool {
					for _, l := range strings.Split(p.out.String()[from:], "\n") {
						if strings.Contains(l, `msg="standing by"`) && strings.Contains(l, `leader="`+leader+` (token `) {
							return true
						}
					}
					return false
				})
			}
			a := start("a")
			testkit.Eventually(t, 30*time.Second, "a elected", func() bool { return strings.Contains(a.out.String(), "elected") })
			b := start("b")
			standingBy(b, 0, "a")
			c := start("c")
			standingBy(c, 0, "a")
			fromB, fromC := len(b.out.String()), len(c.out.String())
			if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			a.wait(t, 30*time.Second)
			// b or c takes over (Consul has no queue), and the other
			// reports it.
			var next, other *batonProc
			testkit.Eventually(t, 30*time.Second, "b or c elected", func() bool {
				switch {
				case strings.Contains(b.out.String()[fromB:], "msg=elected"):
					next, other = b, c
				case strings.Contains(c.out.String()[fromC:], "msg=elected"):
					next, other = c, b
				}
				return next != nil
			})
			from := fromB
			if other == c {
				from = fromC
			}
			standingBy(other, from, next.name)
		})
	}
}

// startApp runs args in-process, like runApp, with the standby reports
// timed by periods, until ctx ends; it returns stderr as it grows and a
// function that waits for the run to return.
func startApp(t *testing.T, ctx context.Context, periods standbyPeriods, args ...string) (stderr *testserver.SyncBuffer, wait func() int) {
	t.Helper()
	stderr = &testserver.SyncBuffer{}
	app := &App{
		Stdout:    io.Discard,
		Stderr:    stderr,
		LookupEnv: func(string) (string, bool) { return "", false },
		Environ:   func() []string { return []string{"PATH=" + os.Getenv("PATH")} },
		Hostname:  func() (string, error) { return "testhost", nil },
		standby:   periods,
	}
	done := make(chan int, 1)
	go func() { done <- app.Main(ctx, args) }()
	var code int
	var once sync.Once
	wait = func() int {
		once.Do(func() { code = <-done })
		return code
	}
	t.Cleanup(func() { wait() })
	return stderr, wait
}

// TestRunLeaderDoesNotReportBackendUnreachable: a leader on a backend whose
// standbys ask who leads (memory://, agent://), which asks nobody while it
// leads, must not warn that the backend does not answer; a standby whose
// backend accepts connections but never answers must still warn, again
// and again. Both run with the same short report periods; the healthy
// leader runs first, so by the time the other has warned three times, the
// leader has led through at least three report periods.
func TestRunLeaderDoesNotReportBackendUnreachable(t *testing.T) {
	t.Parallel()
	periods := standbyPeriods{settle: 10 * time.Millisecond, firstAnswer: 100 * time.Millisecond, warnEvery: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const noAnswer = "backend unreachable: no answer"

	leader, waitLeader := startApp(t, ctx, periods, "run", "--backend", "memory://", "--lease", "x", "--id", "healthy", "--", "sleep", "600")
	testkit.Eventually(t, 30*time.Second, "the memory:// run to start its command", func() bool {
		return strings.Contains(leader.String(), `msg="child started"`)
	})

	// An agent's socket, in a directory of the test's user as the client
	// requires, whose server accepts connections and never answers.
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	standby, waitStandby := startApp(t, ctx, periods, "run", "--backend", "agent://"+sock, "--lease", "x", "--id", "stuck", "--", "sleep", "600")
	testkit.Eventually(t, 60*time.Second, "the run on a silent backend to warn three times", func() bool {
		return strings.Count(standby.String(), noAnswer) >= 3
	})
	cancel()
	waitLeader()
	waitStandby()
	if strings.Contains(leader.String(), "backend unreachable") {
		t.Errorf("the healthy memory:// leader warned that its backend is unreachable:\n%s", leader.String())
	}
}
