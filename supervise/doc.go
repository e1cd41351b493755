//go:build linux

// Package supervise runs a command for as long as a lease is held and makes
// sure that the command and everything it started are gone by the lease's
// deadline, whatever happens to the process that started it. StartTerm
// runs a command for one term of a lease, with the term's safe-until as
// that deadline; it is what `baton run` and `baton cron` run their command
// with, and Go programs that embed baton can use it the same way (Linux
// only).
//
// # Guarantees
//
// The command runs under a guard: a small separate process (this same
// program, re-executed; see GuardMain) in a process group of its own,
// between the caller and the command. The guard
//
//   - holds the deadline (Config.Deadline, moved by Process.Extend) on its
//     own clock. When it is not extended in time, the guard sends SIGTERM
//     Config.Grace before the deadline and SIGKILL KillLead before it, so
//     that the kill has landed by the deadline. It does so by itself: a
//     caller that hangs, deadlocks or is stopped with SIGSTOP (alone or with
//     its whole process group) simply stops extending it;
//   - stops the command the same way (SIGTERM, SIGKILL after the grace, and
//     never later than KillLead before the deadline) when the caller dies,
//     even by SIGKILL: it sees its end of a socket close;
//   - stops every descendant, not only the command's process group: the
//     guard is a child subreaper, so processes that double-fork or call
//     setsid stay below it, and where cgroup v2 is writable (as root, or in
//     a cgroup delegated to the caller, e.g. systemd's Delegate=yes; Linux
//     5.14 or later) the command runs in a cgroup of its own below the
//     caller's, killed at once with cgroup.kill;
//   - exits only once the command and every descendant are gone, and
//     Process.Stop returns only then.
//
// Not covered:
//
//   - A guard stopped (SIGSTOP, a VM pause) together with the command
//     resumes late and the command with it, after another holder may have
//     begun. No supervision can prevent this; fencing tokens can: pass the
//     term's token with every write and have the store reject old ones.
//   - A guard killed by SIGKILL takes the command with it (parent-death
//     signal), and the caller, if it still runs, kills the command's process
//     group and cgroup: with cgroup v2 every descendant dies, without it the
//     descendants that left the command's process group survive. If the
//     caller is gone too, only the command itself dies.
//   - A guard stopped on its own (SIGSTOP of its pid) leaves the command
//     running until the caller's Stop context ends; the caller then kills
//     the command's process group and cgroup, and the guard. A caller that
//     does not call Stop by the deadline (baton does) gives no such backup.
//   - Processes started on the command's behalf by something outside its
//     tree (systemd-run, a container runtime, at): they are not descendants.
//   - A process in uninterruptible sleep (stuck I/O) dies only when the I/O
//     returns; SIGKILL cannot land earlier.
//
// Start re-executes /proc/self/exe as the guard, so a program that uses this
// package must call GuardMain first thing in main (and in TestMain).
package supervise
