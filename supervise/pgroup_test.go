//go:build darwin || (linux && batonpgroup)

package supervise

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/proctree"
	"github.com/batonhq/baton/internal/testkit"
)

// The guard's process-group mode, which macOS runs: on Linux these tests
// run with `go test -tags batonpgroup`, which builds that mode instead of
// the subreaper and cgroup one.

const pgroupTimeout = 10 * time.Second

// lingerer starts a command that leaves a sleep behind in its own process
// group and exits: the sleep is orphaned to init, out of the guard's
// children. It returns the process and the sleep's pid.
func lingerer(t *testing.T, deadline time.Time) (*Process, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	p, err := Start(Config{
		Command:  []string{"sh", "-c", `sleep 1000 & echo $! > "$1"`, "sh", pidFile},
		Grace:    200 * time.Millisecond,
		Deadline: deadline,
	})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	testkit.Eventually(t, pgroupTimeout, "the command to write the sleep's pid", func() bool {
		b, err := os.ReadFile(pidFile)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
			return err == nil
		}
		return false
	})
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
	select {
	case <-p.Done():
	case <-time.After(pgroupTimeout):
		t.Fatal("the command did not exit")
	}
	q, ok := proctree.Read(pid)
	if !ok || q.PGID != p.Pid() {
		t.Fatalf("the sleep %d is not alive in the command's group %d (%+v, %v): the test proves nothing", pid, p.Pid(), q, ok)
	}
	if q.PPID == p.guard.Process.Pid {
		t.Fatalf("the sleep %d is the guard's child: the guard is a subreaper, not in process-group mode", pid)
	}
	return p, pid
}

func TestPlatformGuardProcessGroup(t *testing.T) {
	if PlatformGuard != "process group" {
		t.Fatalf("PlatformGuard = %q in the process-group build", PlatformGuard)
	}
	if err := BecomeSubreaper(); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("BecomeSubreaper() = %v, want errors.ErrUnsupported", err)
	}
}

// A member of the command's process group orphaned when the command exits
// is stopped by Stop, which returns only once it is gone.
func TestProcessGroupModeStopWaitsForOrphanedGroup(t *testing.T) {
	p, pid := lingerer(t, time.Time{})
	select {
	case <-p.gone:
		t.Fatal("the guard exited while a member of the command's group lives on")
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgroupTimeout)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, ok := proctree.Read(pid); ok {
		t.Fatalf("Stop returned while the orphaned group member %d lives", pid)
	}
}

// The guard stops an orphaned member of the command's group at the
// deadline by itself, with no Stop.
func TestProcessGroupModeDeadlineStopsOrphanedGroup(t *testing.T) {
	deadline := time.Now().Add(2 * time.Second)
	p, pid := lingerer(t, deadline)
	select {
	case <-p.gone:
	case <-time.After(pgroupTimeout):
		t.Fatal("the guard did not exit after the deadline")
	}
	if _, ok := proctree.Read(pid); ok {
		t.Fatalf("the orphaned group member %d outlived the deadline", pid)
	}
}
