package harness

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
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
	testkit.Eventually(t, 10*time.Second, "the tree to grow to 4 processes", func() bool {
		tree = processTree(cmd.Process.Pid)
		return len(tree) >= 4 // sh, the inner sh, and two sleeps
	})
	stopped := stopTree(cmd.Process.Pid)
	for _, p := range tree {
		if !slices.Contains(stopped, p) {
			t.Errorf("process %d of the tree was not stopped", p)
		}
		// SIGSTOP takes effect when the process is next scheduled.
		testkit.Eventually(t, 5*time.Second, fmt.Sprintf("process %d in state T (stopped) after SIGSTOP", p), func() bool {
			return state(t, p) == "T"
		})
	}
	contTree(stopped)
	for _, p := range tree {
		testkit.Eventually(t, 5*time.Second, fmt.Sprintf("process %d to run again after contTree", p), func() bool {
			return state(t, p) != "T"
		})
	}
}
