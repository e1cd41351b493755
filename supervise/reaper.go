//go:build linux || darwin

package supervise

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/proctree"
)

// ErrDescendantsLost is wrapped by the error Process.Stop returns, and by
// Process.Err, when the guard was killed (SIGKILL by another process) while
// the command ran without a cgroup of its own, in a program that did not
// call BecomeSubreaper: descendants of the command that had left its
// process group (double fork, setsid) were re-parented to init or to
// another subreaper, and nothing can find them. They may still run. A
// caller that holds a lease should not release it early then: the term
// must end by its own expiry.
var ErrDescendantsLost = errors.New("supervise: the guard was killed, and descendants of the command that left its process group may still run where nothing can find them (no cgroup, and this process is not a subreaper: see BecomeSubreaper)")

// orphanWarnEvery is how often a caller that cannot get rid of a guard's
// tree says so while it goes on trying.
const orphanWarnEvery = 5 * time.Second

// reaper is the process-wide state of BecomeSubreaper.
var reaper struct {
	mu sync.Mutex
	on bool
	// guards are the guards started and not yet waited for: children of
	// this process that are not orphans.
	guards map[int]bool
}

// startGuard starts cmd, a guard, and records it as one, so that a
// concurrent reapOrphans does not take it for an orphan.
func startGuard(cmd *exec.Cmd) error {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	if reaper.guards == nil {
		reaper.guards = make(map[int]bool)
	}
	reaper.guards[cmd.Process.Pid] = true
	return nil
}

// guardWaited forgets a guard that was waited for.
func guardWaited(pid int) {
	reaper.mu.Lock()
	delete(reaper.guards, pid)
	reaper.mu.Unlock()
}

// subreaper reports whether BecomeSubreaper was called.
func subreaper() bool {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	return reaper.on
}

// reapOrphans kills and reaps every child of this process, a subreaper,
// that is not a guard, with everything below it, and returns once none is
// left: a guard has died, and they are what was below it. A process that
// SIGKILL does not end (uninterruptible sleep; another user's) keeps it
// trying, and saying so.
func reapOrphans(log *slog.Logger) {
	self := os.Getpid()
	warn := time.Now().Add(time.Second)
	for {
		reaper.mu.Lock()
		live, zombies := proctree.Children(self)
		left, reaped := 0, 0
		for _, pid := range zombies {
			if reaper.guards[pid] {
				continue
			}
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			reaped++
		}
		for _, pid := range live {
			if reaper.guards[pid] {
				continue
			}
			left++
			for _, d := range proctree.Descendants(pid) {
				_ = syscall.Kill(d.PID, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		reaper.mu.Unlock()
		if left == 0 && reaped == 0 {
			return
		}
		if left > 0 && time.Now().After(warn) {
			log.Error("orphans of a dead guard survive SIGKILL (uninterruptible sleep, or another user's); still trying", "left", left)
			warn = time.Now().Add(orphanWarnEvery)
		}
		time.Sleep(killRetry)
	}
}
