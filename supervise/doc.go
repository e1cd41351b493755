//go:build linux || darwin

// Package supervise runs a command for as long as a lease is held and makes
// sure that the command and everything it started are gone by the lease's
// deadline, whatever happens to the process that started it. StartTerm runs
// a command for one term of a lease, with the term's safe-until as that
// deadline; Runner runs it for each term a baton.Elector wins, restarting
// it when it exits by itself. `baton run` is a Runner, `baton cron` starts
// its command with one for each slot, and Go programs that embed baton can
// do the same (Linux; macOS with weaker guarantees, below).
//
// # Guarantees
//
// The command runs under a guard: a small separate process (this same
// program, re-executed; see GuardMain) in a process group of its own, between
// the caller and the command. The guard
//
//   - holds the deadline (Config.Deadline, moved by Process.Extend) on its own
//     clock and, when it is not extended in time, sends SIGTERM Config.Grace
//     before it and SIGKILL KillLead before it, so that the kill has landed
//     by the deadline. It does so by itself: a caller that hangs, deadlocks
//     or is stopped with SIGSTOP (alone or with its process group) simply
//     stops extending it;
//   - stops the command the same way when the caller dies, even by SIGKILL
//     (it sees its end of a socket close);
//   - stops every descendant: it is a child subreaper, so processes that
//     double-fork or call setsid stay below it, and where cgroup v2 is
//     writable (as root, or delegated, e.g. systemd's Delegate=yes; Linux
//     5.14 or later) the command runs in a cgroup of its own below the
//     caller's, killed at once with cgroup.kill;
//   - exits, and Process.Stop returns, only once every descendant is gone.
//
// The guard itself may be stopped, hung or killed by another process of the
// same user. A guard stopped or hung while its caller stops the command
// (Process.Stop, when its context ends) is resumed with SIGCONT, and the
// caller kills every process below it until none is left alive, and only
// then the guard: as their subreaper, a live guard keeps them all in its
// tree, whereas its death would hand them to init. A guard resumed after a
// stop reads the extensions queued meanwhile before it judges the
// deadline. A guard killed by SIGKILL takes the command with it
// (parent-death signal); the caller kills the command's process group and
// cgroup and waits until the cgroup is empty, and, if it called
// BecomeSubreaper, kills and reaps the escaped descendants, which are
// re-parented to it. A cgroup whose guard and caller were both killed is
// emptied and removed by the next guard started below the same cgroup.
//
// Not covered: a guard stopped together with the command (SIGSTOP, a VM
// pause) resumes late, after another holder may have begun; only fencing
// tokens stop a late write. The same goes for a guard stopped when its
// caller is dead, as nothing else acts on its deadline. A guard killed
// without a cgroup in a caller that is not a subreaper loses descendants
// that left the command's process group to init: Stop and Err report
// ErrDescendantsLost. A guard and caller both killed without a cgroup leave
// those descendants running. Processes started for the command by
// something outside its tree (systemd-run, a container runtime, at) are not
// descendants. A process in uninterruptible sleep dies only when its I/O
// returns, and one that SIGKILL does not end keeps Stop waiting.
//
// # macOS
//
// macOS has no child subreaper, parent-death signal or cgroups, so there the
// guard runs in a weaker process-group mode (PlatformGuard says which mode
// a build has). The guard starts the command in a process group of its
// own and stops that group and the descendants still below it, at the
// deadline, when the caller dies (its socket closes) and on Stop, the same
// way as above; after the command exits, it polls the process table for
// members of the group orphaned to launchd and stops them too before it
// exits. Not covered: a descendant that left the command's process group
// (setsid, a double-forked daemon) once its parent has exited; the command
// and its group when the caller and the guard are both killed; a guard
// killed alone loses the descendants outside the command's group
// (ErrDescendantsLost). BecomeSubreaper returns an error wrapping
// errors.ErrUnsupported. It suits development on a Mac, not production.
// Building with -tags batonpgroup on Linux selects the same mode, so that
// its tests run there.
//
// Start re-executes /proc/self/exe (on macOS, os.Executable) as the guard, which this package's
// initialiser runs (see GuardMain), before the initialisers of most of the
// program's other packages. A program that uses this package should still
// call GuardMain first thing in main (and in TestMain). A guard's start is
// most of what Start costs; Prepare starts one ahead of the command, as
// `baton run` does between terms, so that a new term's command need not
// wait for it.
package supervise
