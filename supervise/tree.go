//go:build linux && !batonpgroup

package supervise

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/proctree"
)

// cgroup is a cgroup v2 directory of the command's own.
type cgroup struct {
	dir string
	fd  int // open directory, for CLONE_INTO_CGROUP; -1 once closed
}

// newCgroup creates a cgroup for the command below the guard's own, or
// returns nil where cgroup v2 is not mounted, not writable (no root, no
// delegation), lacks cgroup.kill (Linux before 5.14), or refuses a child
// (a parent with controllers enabled for its children cannot also hold the
// guard). The subreaper alone then catches the descendants.
func newCgroup() *cgroup {
	mount, root := cgroup2Mount()
	if mount == "" {
		return nil
	}
	own := ownCgroup()
	if own == "" {
		return nil
	}
	rel, ok := strings.CutPrefix(own, root)
	if !ok {
		return nil // our cgroup is outside what is mounted here
	}
	parent := filepath.Join(mount, rel)
	sweepStale(parent)
	dir := filepath.Join(parent, guardCgroupPrefix+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil
	}
	cg := &cgroup{dir: dir, fd: -1}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		cg.remove()
		return nil
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		cg.remove()
		return nil
	}
	cg.fd = fd
	return cg
}

// cgroup2Mount returns where the cgroup v2 hierarchy is mounted and which
// of its directories the mount shows at that point, from
// /proc/self/mountinfo; "" if it is not mounted.
func cgroup2Mount() (mount, root string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return unescapeMount(fields[4]), unescapeMount(fields[3])
			}
		}
	}
	return "", ""
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroup returns this process's cgroup v2 path ("0::/path" in
// /proc/self/cgroup), or "".
func ownCgroup() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p
		}
	}
	return ""
}

func (c *cgroup) closeFD() {
	if c.fd >= 0 {
		syscall.Close(c.fd)
		c.fd = -1
	}
}

// kill sends SIGKILL to every process in the cgroup at once.
func (c *cgroup) kill() {
	_ = os.WriteFile(filepath.Join(c.dir, "cgroup.kill"), []byte("1"), 0)
}

// remove deletes the cgroup. The kernel refuses while it still counts a
// dying process in it, for a moment (usually well under a millisecond)
// after the last one was reaped; the guard exits, and a hand-over goes on,
// only once it is removed, so it retries often, for up to a second.
func (c *cgroup) remove() {
	c.closeFD()
	deadline := time.Now().Add(time.Second)
	for {
		err := syscall.Rmdir(c.dir)
		if err == nil || !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return
		}
		time.Sleep(rmdirRetry)
	}
}

// rmdirRetry is how often remove tries again.
const rmdirRetry = 500 * time.Microsecond

// pids returns the processes in the cgroup.
func (c *cgroup) pids() []int {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// killAll kills every process in the cgroup and removes it once the kernel
// counts none: what the cgroup holds is provably gone then. A process that
// SIGKILL does not end (uninterruptible sleep) keeps it waiting, and
// saying so.
func (c *cgroup) killAll(log *slog.Logger) {
	warn := time.Now().Add(time.Second)
	for {
		c.kill()
		b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			break
		}
		if time.Now().After(warn) {
			log.Error("processes in the child's cgroup survive SIGKILL (uninterruptible sleep?); still trying", "cgroup", c.dir)
			warn = time.Now().Add(orphanWarnEvery)
		}
		time.Sleep(killRetry)
	}
	c.remove()
}

// guardCgroupPrefix begins the name of a command's cgroup; the guard's pid
// follows.
const guardCgroupPrefix = "baton-guard-"

// sweepStale removes the cgroups in parent of guards that are gone. A guard
// removes its command's cgroup before it exits, and its caller does when
// the guard was killed; when both were killed, the cgroup stays, and with
// it whatever the command left that the parent-death signal did not reach.
// That is killed here, as the guard would have, and the cgroup removed.
func sweepStale(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), guardCgroupPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pid, err := strconv.Atoi(rest)
		if err != nil || guardAlive(pid) {
			continue
		}
		c := &cgroup{dir: filepath.Join(parent, e.Name()), fd: -1}
		c.kill()
		c.remove()
	}
}

// guardAlive reports whether pid is a live guard. A zombie has exited (and
// PID 1 in a container may never reap it); a recycled pid is another
// program's.
func guardAlive(pid int) bool {
	if _, ok := proctree.Read(pid); !ok {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == guardName
}
