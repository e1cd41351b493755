//go:build linux || darwin

// Package proctree reads the process tree: a process's parent and process
// group, and the processes below one (from /proc on Linux, from the
// kern.proc sysctl on macOS). The guard of package supervise uses it to
// find a command's descendants, and the chaos harness to stop a
// candidate's whole tree.
package proctree

// Proc is one live process: its id, its parent's and its process group's.
type Proc struct {
	PID, PPID, PGID int
}
