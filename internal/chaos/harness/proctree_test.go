package harness

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// state returns the state letter of pid from /proc ("T" when stopped).
func state(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

// stopTree stops a process and all its descendants, grandchildren
// included, and contTree resumes every one of them.
func TestStopTreeStopsEveryDescendant(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sh -c 'sleep 60' & sleep 60 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range processTree(cmd.Process.Pid) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		_ = cmd.Wait()
	})
	var tree []int
	deadline := time.Now().Add(10 * time.Second)
	for len(tree) < 4 { // sh, the inner sh, and two sleeps
		if time.Now().After(deadline) {
			t.Fatalf("the tree did not grow to 4 processes: %v", tree)
		}
		time.Sleep(10 * time.Millisecond)
		tree = processTree(cmd.Process.Pid)
	}
	stopped := stopTree(cmd.Process.Pid)
	for _, p := range tree {
		if !slices.Contains(stopped, p) {
			t.Errorf("process %d of the tree was not stopped", p)
		}
		// SIGSTOP takes effect when the process is next scheduled.
		deadline := time.Now().Add(5 * time.Second)
		for state(t, p) != "T" {
			if time.Now().After(deadline) {
				t.Fatalf("process %d is in state %s 5s after SIGSTOP, want T (stopped)", p, state(t, p))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	contTree(stopped)
	for _, p := range tree {
		deadline := time.Now().Add(5 * time.Second)
		for state(t, p) == "T" {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still stopped after contTree", p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
