//go:build linux

package proctree

import (
	"os"
	"strconv"
	"strings"
)

// Descendants returns the live (not zombie) processes below root, read from
// /proc, in no particular order. A process that forks while this runs may
// be missed; callers that must catch everything repeat until nothing new
// turns up.
func Descendants(root int) []Proc {
	dir, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return nil
	}
	all := make(map[int]Proc, len(names))
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if p, ok := Read(pid); ok {
			all[pid] = p
		}
	}
	var out []Proc
	for pid, p := range all {
		// Walk up to root or to a process outside the tree. A ppid chain
		// ends at 0 (init's parent), and cycles cannot occur, but a
		// process table read over time is not a snapshot: bound the walk.
		for q, n := p, 0; n < len(all); n++ {
			if q.PPID == root {
				out = append(out, all[pid])
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

// Read reads the parent and process group of a live process from
// /proc/PID/stat; zombies and vanished processes are not ok.
func Read(pid int) (Proc, bool) {
	state, ppid, pgid, ok := readStat(pid)
	if !ok || state == 'Z' || state == 'X' {
		return Proc{}, false
	}
	return Proc{PID: pid, PPID: ppid, PGID: pgid}, true
}

// readStat reads the state, parent and process group of pid from
// /proc/PID/stat.
func readStat(pid int) (state byte, ppid, pgid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	// The command name is parenthesised and may itself contain ") ", so
	// parse from the last ')': " state ppid pgrp ...".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgid, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	return f[0][0], ppid, pgid, true
}

// Group returns the live (not zombie) members of process group pgid,
// wherever they are in the process tree, read from /proc.
func Group(pgid int) []Proc {
	var out []Proc
	for _, p := range all() {
		if p.PGID == pgid {
			out = append(out, p)
		}
	}
	return out
}

// all returns every live process, read from /proc.
func all() []Proc {
	dir, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return nil
	}
	var out []Proc
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if p, ok := Read(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// Children returns the processes whose parent is pid, read from /proc:
// the live ones and, apart, the zombies (exited, not yet reaped).
func Children(pid int) (live, zombies []int) {
	dir, err := os.Open("/proc")
	if err != nil {
		return nil, nil
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return nil, nil
	}
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		child, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		state, ppid, _, ok := readStat(child)
		if !ok || ppid != pid {
			continue
		}
		switch state {
		case 'Z':
			zombies = append(zombies, child)
		case 'X':
		default:
			live = append(live, child)
		}
	}
	return live, zombies
}
