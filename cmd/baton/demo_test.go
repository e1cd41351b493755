package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDemo(t *testing.T) {
	t.Parallel()
	r := runBaton(t, 120*time.Second, "demo", "--nodes", "3", "--rounds", "2", "--ttl", "1s", "--interval", "300ms")
	if r.code != 0 {
		t.Fatalf("demo exited %d; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
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
	if orphans := demoProcesses(); len(orphans) > 0 {
		t.Errorf("processes left behind by the demo: %v", orphans)
	}
}

// demoProcesses lists live processes of the baton binary running demo nodes
// or jobs.
func demoProcesses() []string {
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
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		cmdline := strings.Join(args, " ")
		if args[0] == batonBin && (strings.Contains(cmdline, "--lease demo") || strings.Contains(cmdline, "demo-job")) {
			found = append(found, fmt.Sprintf("%d: %s", pid, cmdline))
		}
	}
	return found
}
