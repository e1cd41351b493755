//go:build linux && !batonpgroup

package supervise

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/batonhq/baton/internal/proctree"
	"golang.org/x/sys/unix"
)

// PlatformGuard says which guarantees the guard gives on this platform:
// "full" here (Linux: a subreaper, a parent-death signal, a cgroup where
// cgroup v2 allows; see the package doc), "process group" where it only
// stops the command's process group and the descendants still below it.
const PlatformGuard = "full"

// guardSubreaper makes the guard the subreaper of the command's tree:
// orphans below the guard, double-forked or setsid or not, become its
// children instead of init's, so none can leave the tree it reaps.
func guardSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	return nil
}

// groupLingers reports whether members of the command's process group
// outlive the guard's last child. Never here: as a subreaper the guard
// has every one of them among its children.
func (g *guard) groupLingers() bool { return false }

// lingerPoll is unused where groupLingers is always false.
const lingerPoll = 0

// BecomeSubreaper makes this process a child subreaper
// (prctl(PR_SET_CHILD_SUBREAPER)): a process orphaned anywhere below it is
// re-parented to it instead of to init. Then a guard killed by a signal it
// cannot catch (SIGKILL from another process), with no cgroup to hold the
// command's tree, hands the command's escaped descendants (those that
// double-forked or called setsid) over to this process, which kills and
// reaps them before Process.Stop returns; without it they go to init, and
// Stop reports ErrDescendantsLost.
//
// It is process-wide and cannot be undone, and it imposes a rule: once a
// guard has died, every child of this process that is not a guard started
// by Start counts as an orphan of that guard's tree, and is killed and
// reaped, also a child the program started by other means (os/exec), whose
// Wait then fails. Call it, before the first Start, only in a program that
// starts child processes through this package alone, as `baton run` and
// `baton cron` do. Orphans of the program's other descendants stay zombies
// until a guard dies.
//
// It is safe for concurrent use, and calling it again does nothing.
func BecomeSubreaper() error {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if reaper.on {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("supervise: prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	reaper.on = true
	return nil
}

// start starts the command in a process group of its own and, where
// cgroup v2 allows, in a new cgroup.
func (g *guard) start(path string, argv, env []string) error {
	sys := &syscall.SysProcAttr{
		// A group of its own lets signals reach the command's whole tree
		// with one kill(-pgid) while sparing the guard.
		Setpgid: true,
		// Should the guard itself be killed, the command dies with it.
		// The kernel clears this when the command execs a set-user-ID or
		// file-capability binary.
		Pdeathsig: syscall.SIGKILL,
	}
	if g.cg != nil {
		// clone3(CLONE_INTO_CGROUP): the command is in its cgroup from its
		// first instruction, so no fork can slip out before it is moved.
		sys.UseCgroupFD = true
		sys.CgroupFD = g.cg.fd
	}
	attr := &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}, Sys: sys}
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil && g.cg != nil && !isExecError(err) {
		// A kernel or sandbox without CLONE_INTO_CGROUP: do without.
		g.cg.remove()
		g.cg = nil
		sys.UseCgroupFD, sys.CgroupFD = false, 0
		pid, err = syscall.ForkExec(path, argv, attr)
	}
	if err != nil {
		if g.cg != nil {
			g.cg.remove()
		}
		return err
	}
	g.pid = pid
	if g.cg != nil {
		g.cg.closeFD()
		g.send(encodeString(msgCgroup, g.cg.dir))
	}
	g.send(encode(msgStarted, int64(pid)))
	return nil
}

// isExecError reports whether err is about the command's file rather than
// the cgroup.
func isExecError(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EACCES) ||
		errors.Is(err, syscall.ENOEXEC) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ETXTBSY)
}

// groupAlive reports whether the command's process group still has a
// member among ds, the guard's descendants. Once the command was reaped and
// its group emptied, its pid (the group's id) may be reused by an unrelated
// process: the group must not be signalled then.
func (g *guard) groupAlive(ds []proctree.Proc) bool {
	for _, d := range ds {
		if d.PGID == g.pid {
			return true
		}
	}
	return false
}
