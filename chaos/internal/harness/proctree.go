package harness

import (
	"slices"
	"syscall"

	"github.com/batonhq/baton/internal/proctree"
)

// processTree returns pid and every live process below it, parents before
// children.
func processTree(pid int) []int {
	procs := proctree.Descendants(pid)
	parent := make(map[int]int, len(procs))
	for _, p := range procs {
		parent[p.PID] = p.PPID
	}
	depth := func(p int) int {
		d := 0
		for ; p != pid && d <= len(parent); d++ {
			p = parent[p]
		}
		return d
	}
	out := []int{pid}
	for _, p := range procs {
		out = append(out, p.PID)
	}
	slices.SortStableFunc(out[1:], func(a, b int) int { return depth(a) - depth(b) })
	return out
}

// stopTree sends SIGSTOP to pid and all its descendants and returns the
// processes stopped, parents first, for contTree. A process that forks
// between the read and the signal would be missed, so it reads again until
// nothing is new.
func stopTree(pid int) []int {
	stopped := map[int]bool{}
	var order []int
	for range 5 {
		added := false
		for _, p := range processTree(pid) {
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
