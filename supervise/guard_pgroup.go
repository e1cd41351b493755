//go:build darwin || (linux && batonpgroup)

package supervise

import (
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/proctree"
)

// PlatformGuard says which guarantees the guard gives on this platform:
// "process group" here (macOS): the guard stops the command's process
// group and the descendants still below it, but is no subreaper, has no
// parent-death signal and no cgroup, so a descendant that leaves the
// command's process group and is orphaned (a double-forked daemon) or
// outlives a killed guard is not stopped; see the package doc. "full" on
// Linux.
const PlatformGuard = "process group"

// errNoSubreaper is why BecomeSubreaper fails on this platform.
var errNoSubreaper = fmt.Errorf("supervise: this platform has no child subreaper: %w", errors.ErrUnsupported)

// BecomeSubreaper would make this process a child subreaper, which this
// platform does not have: it returns an error wrapping
// errors.ErrUnsupported. (On Linux it makes a guard killed by another
// process hand the command's escaped descendants to this process.)
func BecomeSubreaper() error { return errNoSubreaper }

// guardSubreaper does nothing: this platform has no subreaper, and orphans
// below the guard go to init (launchd).
func guardSubreaper() error { return nil }

// lingerPoll is how often a guard whose last child is gone looks for the
// members of the command's process group that outlived it.
const lingerPoll = 50 * time.Millisecond

// groupLingers reports whether members of the command's process group
// live on although the guard has no child left: they were orphaned to
// init, which the guard cannot wait for, so it polls the process table.
// A group id is not reused while the group has members, so the poll cannot
// mistake another program's group for the command's.
func (g *guard) groupLingers() bool { return len(proctree.Group(g.pid)) > 0 }

// groupAlive reports whether the command's process group still has a
// member anywhere in the process tree (not only among ds, the guard's
// descendants: orphaned members went to init). Once the group is empty its
// id may be reused by an unrelated process: it must not be signalled then.
func (g *guard) groupAlive(ds []proctree.Proc) bool { return g.groupLingers() }

// start starts the command in a process group of its own.
func (g *guard) start(path string, argv, env []string) error {
	sys := &syscall.SysProcAttr{
		// A group of its own lets signals reach the command's whole tree
		// with one kill(-pgid) while sparing the guard.
		Setpgid: true,
	}
	attr := &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}, Sys: sys}
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		return err
	}
	g.pid = pid
	g.send(encode(msgStarted, int64(pid)))
	return nil
}

// cgroup stands in for Linux's cgroup v2 directory of the command's own,
// which this platform never has: Process.cgroup and guard.cg stay empty.
type cgroup struct {
	dir string
	fd  int
}

// newCgroup returns nil: there are no cgroups here.
func newCgroup() *cgroup { return nil }

func (c *cgroup) pids() []int          { return nil }
func (c *cgroup) kill()                {}
func (c *cgroup) remove()              {}
func (c *cgroup) killAll(*slog.Logger) {}
