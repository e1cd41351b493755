//go:build linux

// Package supervise runs and stops the child command of `baton run`.
//
// Baton may only let the command run while it holds the lease, so the
// package is biased towards making sure the child and everything it spawned
// are really gone: the child gets its own process group so signals reach its
// whole tree, Stop escalates from SIGTERM to SIGKILL, and the kernel kills the
// child if baton itself dies (even by SIGKILL).
package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultGrace is the time Stop waits between SIGTERM and SIGKILL when
// Config.Grace is zero; long enough for typical graceful shutdowns, short
// enough that a lost lease is not overrun for long.
const DefaultGrace = 10 * time.Second

const (
	// ioDrainTimeout bounds how long Done waits, after the child has exited,
	// for non-file Stdin/Stdout/Stderr copies to finish. Without it a
	// background grandchild holding the pipe open would keep Done open
	// until that grandchild exits, which may be never.
	ioDrainTimeout = 2 * time.Second

	// groupPollInterval is how often Stop checks whether the process group
	// has emptied; the kernel offers no notification for a group whose
	// members are not our children.
	groupPollInterval = 25 * time.Millisecond
)

// Config describes the command to supervise.
type Config struct {
	// Command is the program and its arguments, as for exec.Command:
	// Command[0] is looked up in the supervisor's PATH unless it contains a
	// slash, and it is also passed to the child as argv[0].
	Command []string

	// Env is the child's complete environment. Nil inherits the
	// supervisor's environment (exec.Cmd semantics); callers that add
	// BATON_* variables should pass append(os.Environ(), ...).
	Env []string

	// Stdin, Stdout and Stderr are the child's standard streams; nil means
	// /dev/null. *os.File values are handed to the child directly, anything
	// else is copied through a pipe.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer

	// Grace is the time Stop allows between SIGTERM and SIGKILL. Zero means
	// DefaultGrace; negative is rejected because "kill immediately" should
	// be an explicit, tiny positive value rather than a sign typo.
	Grace time.Duration

	// Logger receives lifecycle events; nil discards them.
	Logger *slog.Logger
}

// Process is a running (or finished) supervised child. All methods are safe
// for concurrent use.
type Process struct {
	cmd   *exec.Cmd
	pid   int // also the process group id, thanks to Setpgid
	grace time.Duration
	log   *slog.Logger

	termOnce sync.Once
	killAt   time.Time // set inside termOnce

	done     chan struct{}
	err      error // set before done is closed
	exitCode int   // set before done is closed
}

// Start starts the command in a new process group and returns once it is
// running. A command that cannot be found or executed yields an error naming
// the command, so a typo in `baton run -- cmd` is obvious.
func Start(cfg Config) (*Process, error) {
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, errors.New("supervise: no command given")
	}
	if cfg.Grace < 0 {
		return nil, fmt.Errorf("supervise: negative grace period %v", cfg.Grace)
	}
	grace := cfg.Grace
	if grace == 0 {
		grace = DefaultGrace
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	name := cfg.Command[0]
	cmd := exec.Command(name, cfg.Command[1:]...)
	if cmd.Err != nil {
		return nil, commandError(name, cmd.Err)
	}
	cmd.Env = cfg.Env
	cmd.Stdin = cfg.Stdin
	cmd.Stdout = cfg.Stdout
	cmd.Stderr = cfg.Stderr
	cmd.WaitDelay = ioDrainTimeout
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A group of its own lets Stop and Signal reach the child's whole
		// tree with one kill(-pgid), and keeps terminal-generated signals
		// (Ctrl-C) aimed at baton, which decides what the child gets.
		Setpgid: true,
		// If baton dies, even by SIGKILL, it can no longer guarantee it
		// holds the lease, so the child must not outlive it. The kernel
		// delivers this when the *thread* that forked the child exits; see
		// run for how that thread is kept alive. The race where baton dies
		// between fork and the child's prctl is closed by the standard
		// library, which re-checks getppid after prctl and signals itself.
		// Limits: only the direct child is covered (its descendants are
		// orphaned, not killed), and the kernel clears the setting when the
		// child execs a set-user-ID/set-group-ID or file-capability binary.
		Pdeathsig: syscall.SIGKILL,
	}

	p := &Process{
		cmd:      cmd,
		grace:    grace,
		log:      log,
		done:     make(chan struct{}),
		exitCode: -1,
	}
	started := make(chan error, 1)
	go p.run(started)
	if err := <-started; err != nil {
		return nil, commandError(name, err)
	}
	p.pid = cmd.Process.Pid
	log.Info("child started", "pid", p.pid, "command", cfg.Command, "grace", grace)
	return p, nil
}

// run forks the child and reaps it on a goroutine locked to its OS thread for
// the child's whole life.
//
// Pdeathsig is tied to the forking thread, not the process. The Go runtime
// terminates a thread only when a goroutine exits while locked to it, and any
// code in the process (a library calling LockOSThread and returning without
// unlocking) could do that to whatever thread it happens to be running on,
// including the one that forked our child, which would then be SIGKILLed for
// no reason. Holding the forking thread locked here means no other goroutine
// can ever run on it, so it lives exactly as long as this goroutine. Starting
// on a fresh goroutine also sidesteps a caller that is itself locked to a
// thread it is about to abandon. The cost is one parked OS thread per child.
func (p *Process) run(started chan<- error) {
	runtime.LockOSThread()
	// Unlocking before returning hands the thread back to the scheduler
	// instead of destroying it; the child is reaped by then, so Pdeathsig no
	// longer matters.
	defer runtime.UnlockOSThread()

	if err := p.cmd.Start(); err != nil {
		started <- err
		return
	}
	started <- nil

	err := p.cmd.Wait()
	code := -1
	if st := p.cmd.ProcessState; st != nil {
		code = exitCode(st)
	}
	p.err = err
	p.exitCode = code
	p.log.Info("child exited", "pid", p.cmd.Process.Pid, "exit_code", code, "err", err)
	close(p.done)
}

// exitCode follows the shell convention (128+N for death by signal N) so that
// `baton run` can pass the child's status through as its own exit status.
func exitCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

func commandError(name string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("supervise: command %q not found; check that it is installed and in PATH: %w", name, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("supervise: command %q is not executable; check its permissions and PATH: %w", name, err)
	default:
		return fmt.Errorf("supervise: starting command %q: %w", name, err)
	}
}

// Pid returns the child's process id, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Done returns a channel closed once the child has exited and been reaped
// (and its piped output drained, for at most a couple of seconds). Other
// members of its process group may still be running; Stop removes them.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode returns the child's exit status once Done is closed, 128+N if it
// was killed by signal N, and -1 while it is still running.
func (p *Process) ExitCode() int {
	select {
	case <-p.done:
		return p.exitCode
	default:
		return -1
	}
}

// Err returns nil while the child runs or if it exited with status 0, and
// otherwise the error from exec.Cmd.Wait: usually an *exec.ExitError, or
// exec.ErrWaitDelay if a successful child left its output pipes held open.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Signal sends sig to the child's whole process group, since signalling only
// the leader would leave e.g. the real server behind a wrapper script
// untouched. It returns os.ErrProcessDone once nothing is left to signal.
func (p *Process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("supervise: unsupported signal %v", sig)
	}
	return p.signal(s)
}

func (p *Process) signal(sig syscall.Signal) error {
	// Once the leader is reaped and the group is empty the pgid number may
	// be recycled, so never signal it blindly after that point.
	if p.gone() {
		return os.ErrProcessDone
	}
	delivered := false
	err := syscall.Kill(-p.pid, sig)
	switch {
	case err == nil:
		delivered = true
	case errors.Is(err, syscall.ESRCH):
		err = nil
	}
	// A child that moved itself to another group (setsid, setpgid) would
	// otherwise escape; signal it directly then, but not when it is still in
	// the group, because some programs treat a second SIGTERM/SIGINT as
	// "abort shutdown now".
	select {
	case <-p.done:
	default:
		if pgid, gerr := syscall.Getpgid(p.pid); gerr == nil && pgid != p.pid {
			if serr := p.cmd.Process.Signal(sig); serr == nil {
				delivered = true
			} else if !errors.Is(serr, os.ErrProcessDone) && err == nil {
				err = serr
			}
		}
	}
	if err != nil {
		return fmt.Errorf("supervise: signalling process group %d with %v: %w", p.pid, sig, err)
	}
	if !delivered {
		return os.ErrProcessDone
	}
	p.log.Debug("signalled child process group", "pgid", p.pid, "signal", sig)
	return nil
}

// Stop terminates the child and its process group: SIGTERM to the group, then
// SIGKILL to the group once Grace has passed since the first Stop call, or as
// soon as ctx ends. It returns only when the child has been reaped and the
// group is empty or has been sent SIGKILL, even if ctx has ended, because
// returning earlier would let baton give up the lease while the command may
// still be running. Group members left behind by a child that already
// exited are stopped the same way, so call Stop even after Done is closed.
//
// Stop returns ctx.Err() if ctx forced the escalation to SIGKILL and nil
// otherwise; the child's own outcome is reported by ExitCode and Err. Stop is
// idempotent and may be called concurrently.
func (p *Process) Stop(ctx context.Context) error {
	p.termOnce.Do(func() {
		p.killAt = time.Now().Add(p.grace)
		if p.gone() {
			return
		}
		p.log.Info("stopping child", "pgid", p.pid, "signal", syscall.SIGTERM, "grace", p.grace)
		if err := p.signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			p.log.Warn("sending SIGTERM to child failed", "pgid", p.pid, "err", err)
		}
	})

	grace := time.NewTimer(time.Until(p.killAt))
	defer grace.Stop()
	poll := time.NewTicker(groupPollInterval)
	defer poll.Stop()
	done := p.done
	var ctxErr error
	for !p.gone() {
		select {
		case <-done:
			done = nil // re-check the group now, then keep polling
		case <-poll.C:
		case <-grace.C:
			p.kill("grace period expired")
			<-p.done
			return nil
		case <-ctx.Done():
			ctxErr = ctx.Err()
			p.kill("context ended: " + ctxErr.Error())
			<-p.done
			return ctxErr
		}
	}
	return nil
}

func (p *Process) kill(why string) {
	p.log.Warn("killing child process group", "pgid", p.pid, "reason", why)
	if err := p.signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.log.Error("sending SIGKILL to child failed", "pgid", p.pid, "err", err)
	}
}

// gone reports whether the child has been reaped and no live process remains
// in its group.
func (p *Process) gone() bool {
	select {
	case <-p.done:
	default:
		return false
	}
	err := syscall.Kill(-p.pid, 0)
	if errors.Is(err, syscall.ESRCH) {
		return true
	}
	// kill(2) still finds zombies, and orphans reparented to a PID 1 that
	// never reaps (common in containers) stay zombies forever; they hold no
	// resources worth waiting for, so look closer before concluding that
	// the group is still alive.
	return !groupHasLiveMember(p.pid)
}

// groupHasLiveMember scans /proc for a non-zombie process in group pgid. It
// errs on the side of "alive" when /proc cannot be read, which only costs
// Stop the rest of the grace period.
func groupHasLiveMember(pgid int) bool {
	dir, err := os.Open("/proc")
	if err != nil {
		return true
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return true
	}
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		state, pg, ok := procStat(name)
		if ok && pg == pgid && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

// procStat returns the state and process group from /proc/<pid>/stat.
func procStat(pid string) (state byte, pgid int, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name is parenthesised and may itself contain ") ", so
	// parse from the last ')': " state ppid pgrp ...".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pg, err := strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pg, true
}

// DefaultForwardSignals are the signals Forward relays when given none: the
// ones with an application-defined meaning (reload, reopen logs, dump state,
// terminal resize) that the child would have received had it not been moved
// out of the terminal's foreground process group.
func DefaultForwardSignals() []os.Signal {
	return []os.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGQUIT}
}

// Forward relays sigs received by this process to the child's process group
// until ctx ends or the returned stop function is called; with no sigs it
// relays DefaultForwardSignals. While forwarding, those signals no longer
// have their default effect on this process (SIGHUP and SIGQUIT would
// otherwise kill baton and, through Pdeathsig, the child). stop unregisters
// the relay with signal.Stop, waits for its goroutine to finish, and may be
// called more than once.
//
// SIGINT and SIGTERM are deliberately not in the default set: for baton they
// mean "stop", which should go through Stop so the lease is released after
// the child is gone.
func (p *Process) Forward(ctx context.Context, sigs ...os.Signal) (stop func()) {
	if len(sigs) == 0 {
		sigs = DefaultForwardSignals()
	}
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, sigs...)

	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-quit:
				return
			case sig := <-ch:
				err := p.Signal(sig)
				switch {
				case err == nil:
					p.log.Info("forwarded signal to child", "pgid", p.pid, "signal", sig)
				case errors.Is(err, os.ErrProcessDone):
					p.log.Debug("not forwarding signal, child is gone", "signal", sig)
				default:
					p.log.Warn("forwarding signal to child failed", "signal", sig, "err", err)
				}
			}
		}
	}()

	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-finished
	}
}
