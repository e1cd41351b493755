package proctree

import "golang.org/x/sys/unix"

// sZomb is a zombie's p_stat (SZOMB in <sys/proc.h>).
const sZomb = 5

// table returns every process of the host from the kern.proc.all sysctl,
// zombies flagged apart.
func table() (live []Proc, zombie map[int]Proc) {
	ks, err := unix.SysctlKinfoProcSlice("kern.proc.all")
	if err != nil {
		return nil, nil
	}
	zombie = make(map[int]Proc)
	for i := range ks {
		k := &ks[i]
		p := Proc{PID: int(k.Proc.P_pid), PPID: int(k.Eproc.Ppid), PGID: int(k.Eproc.Pgid)}
		if k.Proc.P_stat == sZomb {
			zombie[p.PID] = p
			continue
		}
		live = append(live, p)
	}
	return live, zombie
}

// Descendants returns the live (not zombie) processes below root, read
// from the kern.proc sysctl, in no particular order. A process that forks
// while this runs may be missed; callers that must catch everything repeat
// until nothing new turns up.
func Descendants(root int) []Proc {
	live, _ := table()
	all := make(map[int]Proc, len(live))
	for _, p := range live {
		all[p.PID] = p
	}
	var out []Proc
	for _, p := range live {
		// Walk up to root or to a process outside the tree, bounded as
		// the table is not read in one instant.
		for q, n := p, 0; n < len(all); n++ {
			if q.PPID == root {
				out = append(out, p)
				break
			}
			next, ok := all[q.PPID]
			if !ok {
				break
			}
			q = next
		}
	}
	return out
}

// Read reads the parent and process group of a live process; zombies and
// vanished processes are not ok.
func Read(pid int) (Proc, bool) {
	k, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil || k.Proc.P_pid != int32(pid) || k.Proc.P_stat == sZomb {
		return Proc{}, false
	}
	return Proc{PID: pid, PPID: int(k.Eproc.Ppid), PGID: int(k.Eproc.Pgid)}, true
}

// Group returns the live (not zombie) members of process group pgid,
// wherever they are in the process tree.
func Group(pgid int) []Proc {
	live, _ := table()
	var out []Proc
	for _, p := range live {
		if p.PGID == pgid {
			out = append(out, p)
		}
	}
	return out
}

// Children returns the processes whose parent is pid: the live ones and,
// apart, the zombies (exited, not yet reaped).
func Children(pid int) (live, zombies []int) {
	procs, zs := table()
	for _, p := range procs {
		if p.PPID == pid {
			live = append(live, p.PID)
		}
	}
	for _, z := range zs {
		if z.PPID == pid {
			zombies = append(zombies, z.PID)
		}
	}
	return live, zombies
}
