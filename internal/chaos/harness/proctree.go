package harness

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// descendants returns pid and every process descended from it, parents
// before children, read from /proc. A process that forks between the read
// and a signal is missed; stopTree reads again until nothing is new.
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []int{pid}
	}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The command name, in parentheses, may hold spaces; the fields
		// after its closing parenthesis are "state ppid ...".
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		children[ppid] = append(children[ppid], p)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// stopTree sends SIGSTOP to pid and all its descendants and returns the
// processes stopped, for contTree.
func stopTree(pid int) []int {
	stopped := map[int]bool{}
	var order []int
	for range 5 {
		added := false
		for _, p := range descendants(pid) {
			if stopped[p] {
				continue
			}
			if syscall.Kill(p, syscall.SIGSTOP) == nil {
				stopped[p] = true
				order = append(order, p)
				added = true
			}
		}
		if !added {
			break
		}
	}
	return order
}

// contTree continues the processes stopTree stopped, the last found first:
// the command before its guard, the guard before baton. That is the worst
// order, in which the command may act before anything could stop it.
func contTree(pids []int) {
	for i := len(pids) - 1; i >= 0; i-- {
		_ = syscall.Kill(pids[i], syscall.SIGCONT)
	}
}
