package harness

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/proctree"
)

// hogFactor is how many busy processes a hog runs per core: twice as many
// as the machine can run at once, so that every process on it, the
// candidates and the backend included, waits for a core about half the
// time.
const hogFactor = 2

// hog runs a CPU hog beside the candidates and the backend for hold: busy
// processes, hogFactor per core, at the candidates' own priority. One hog
// at a time.
func (h *Harness) hog(d draw, holder *candidate, hold time.Duration) (func() error, int, bool) {
	if !h.claimHog() {
		return nil, 0, false
	}
	n := hogFactor * runtime.NumCPU()
	id := h.begin(d.kind, "machine", holder, false, fmt.Sprintf("%d busy processes for %s", n, hold.Round(time.Millisecond)))
	procs, err := startHog(n)
	return func() error {
		defer h.releaseHog()
		defer stopHog(procs)
		if err != nil {
			return err
		}
		time.Sleep(hold)
		return nil
	}, id, true
}

// startHog starts n processes that spin on the CPU until killed; they die
// with the harness.
func startHog(n int) ([]*exec.Cmd, error) {
	var procs []*exec.Cmd
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return procs, fmt.Errorf("start a CPU hog: %w", err)
		}
		procs = append(procs, cmd)
	}
	return procs, nil
}

func stopHog(procs []*exec.Cmd) {
	for _, p := range procs {
		_ = p.Process.Kill()
	}
	for _, p := range procs {
		_ = p.Wait()
	}
}

func (h *Harness) claimHog() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hogBusy {
		return false
	}
	h.hogBusy = true
	return true
}

func (h *Harness) releaseHog() {
	h.mu.Lock()
	h.hogBusy = false
	h.mu.Unlock()
}

// The targets of a stall, drawn by draw.x: the holder's baton, its guard,
// both, and on raft the raft leader's member.
const (
	stallBaton = iota
	stallGuard
	stallBoth
	stallRaftLeader
)

// stall stops processes with SIGSTOP for hold (100 ms–1 s), then continues
// them: the holder's baton alone (a GC pause or a descheduled process),
// its guard alone, or both, and on raft also the raft leader's member,
// holder or not. The holder's job runs on. A candidate that is not leading
// has no guard; a stall aimed at its guard stops its baton.
func (h *Harness) stall(d draw, holder *candidate, hold time.Duration) (func() error, int, bool) {
	targets := stallBoth + 1
	if h.be.members() {
		targets = stallRaftLeader + 1
	}
	target := int(d.x*float64(targets)) % targets
	var c *candidate
	if target == stallRaftLeader {
		h.mu.Lock()
		i := h.raftLeader
		h.mu.Unlock()
		if i < 0 || !h.cands[i].claim() {
			return nil, 0, false
		}
		c = h.cands[i]
	} else if c = h.pick(d.w, d.v); c == nil {
		return nil, 0, false
	}
	pid, _ := c.proc()
	if pid == 0 {
		c.release()
		return nil, 0, false
	}
	var pids, guards []int
	if target == stallGuard || target == stallBoth {
		guards = children(pid)
	}
	var what string
	switch {
	case target == stallRaftLeader:
		pids, what = []int{pid}, "the raft leader's member (baton)"
	case target == stallGuard && len(guards) > 0:
		pids, what = guards, "guard"
	case target == stallBoth && len(guards) > 0:
		pids, what = append([]int{pid}, guards...), "baton and guard"
	case target == stallBaton:
		pids, what = []int{pid}, "baton"
	default:
		pids, what = []int{pid}, "baton (no guard running)"
	}
	id := h.begin(d.kind, c.id, holder, false, fmt.Sprintf("%s stopped %s", what, hold.Round(time.Millisecond)))
	var errs []string
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
			errs = append(errs, fmt.Sprintf("pid %d: %v", p, err))
		}
	}
	if len(errs) == len(pids) {
		// Every process had exited already: nothing was stopped.
		h.log.Info("stall: nothing to stop", "candidate", c.id, "errors", strings.Join(errs, "; "))
	}
	return func() error {
		defer c.release()
		time.Sleep(hold)
		var err error
		for i := len(pids) - 1; i >= 0; i-- {
			if e := syscall.Kill(pids[i], syscall.SIGCONT); e != nil && !errors.Is(e, syscall.ESRCH) {
				err = errors.Join(err, fmt.Errorf("continue pid %d: %w", pids[i], e))
			}
		}
		return err
	}, id, true
}

// children returns the processes whose parent is pid: a baton's guard.
func children(pid int) []int {
	var out []int
	for _, p := range proctree.Descendants(pid) {
		if p.PPID == pid {
			out = append(out, p.PID)
		}
	}
	return out
}
