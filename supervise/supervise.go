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

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultGrace is the time between SIGTERM and SIGKILL when Config.Grace is
// zero; long enough for typical graceful shutdowns, short enough that a
// lost lease is not overrun for long.
const DefaultGrace = 10 * time.Second

// KillLead is how long before the deadline the guard sends SIGKILL at the
// latest, so that the kill has landed by the deadline; a SIGTERM at the
// deadline less Config.Grace therefore leaves the command Grace−KillLead.
const KillLead = 100 * time.Millisecond

// ErrDeadline is wrapped by Process.Err when the guard stopped the command
// because the deadline passed without an extension.
var ErrDeadline = errors.New("supervise: the deadline passed without an extension; the command was stopped")

const (
	// ioDrainTimeout bounds how long the guard's exit waits for
	// non-file Stdin/Stdout/Stderr copies to finish.
	ioDrainTimeout = 2 * time.Second

	// guardStartTimeout bounds the wait for the guard to report that the
	// command started: a program that does not call GuardMain runs its own
	// main instead of the guard, and Start must not wait for it forever.
	guardStartTimeout = 30 * time.Second

	// guardKillWait is how long Stop, once its context has ended and it
	// has killed the command itself, waits for the guard to exit before
	// killing the guard too (a guard that does not exit is stopped or hung).
	guardKillWait = time.Second

	// writeTimeout bounds a write to a guard that does not read (stopped):
	// the caller must never hang on its guard.
	writeTimeout = time.Second

	// guardExe is what Start re-executes: this program's file, even if the
	// path it was started from has since been replaced or removed.
	guardExe = "/proc/self/exe"
)

// Config describes the command to supervise. The zero value of every field
// but Command means its documented default.
type Config struct {
	// Command is the program and its arguments, as for exec.Command:
	// Command[0] is looked up in the caller's PATH unless it contains a
	// slash, and it is also passed to the command as argv[0].
	Command []string

	// Env is the command's complete environment. Nil inherits the caller's
	// environment (exec.Cmd semantics); callers that add variables should
	// pass append(os.Environ(), ...).
	Env []string

	// Stdin, Stdout and Stderr are the command's standard streams; nil
	// means /dev/null. *os.File values are handed to the command directly,
	// anything else is copied through a pipe.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer

	// Grace is the time between SIGTERM and SIGKILL. Zero means
	// DefaultGrace; negative is rejected because "kill immediately" should
	// be an explicit, tiny positive value rather than a sign typo.
	Grace time.Duration

	// Deadline is when the command must be gone unless Process.Extend moves
	// it; it must carry a monotonic clock reading (time.Now().Add(...), or a
	// baton.Term's SafeUntil). Zero means no deadline: the guard then stops
	// the command only when asked to or when the caller dies.
	Deadline time.Time

	// DisableCgroup keeps the command out of a cgroup of its own even where
	// cgroup v2 is writable; the subreaper still catches its descendants.
	DisableCgroup bool

	// Logger receives lifecycle events; nil discards them.
	Logger *slog.Logger
}

// Process is a running (or finished) command under its guard. All methods
// are safe for concurrent use.
type Process struct {
	guard *exec.Cmd
	conn  *net.UnixConn
	wmu   sync.Mutex // one message at a time on conn
	pid   int
	log   *slog.Logger

	stopOnce sync.Once

	mu       sync.Mutex
	cgroup   string // the command's cgroup directory, or ""
	reason   int64  // why the guard stopped the command on its own, or 0
	exitCode int    // valid once done is closed
	err      error  // valid once done is closed

	done chan struct{} // the command exited (or the guard did)
	gone chan struct{} // the guard exited: the command's tree is gone
}

// Start starts the command under a new guard and returns once it is
// running. A command that cannot be found or executed yields an error naming
// it, so a typo in `baton run -- cmd` is obvious.
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
	path := exec.Command(name)
	if path.Err != nil {
		return nil, commandError(name, path.Err)
	}

	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("supervise: socket for the guard: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "supervise-guard")
	theirs := os.NewFile(uintptr(fds[1]), "supervise-guard")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("supervise: socket for the guard: %w", err)
	}
	conn := fc.(*net.UnixConn)

	env := cfg.Env
	if env == nil {
		env = os.Environ()
	}
	guard := &exec.Cmd{
		Path:       guardExe,
		Args:       append([]string{"baton-guard", path.Path}, cfg.Command...),
		Env:        append(append([]string(nil), env...), guardEnv+"=1"),
		Stdin:      cfg.Stdin,
		Stdout:     cfg.Stdout,
		Stderr:     cfg.Stderr,
		ExtraFiles: []*os.File{theirs}, // fd 3
		WaitDelay:  ioDrainTimeout,
		// A group of its own: a signal to the caller's group (Ctrl-C, a
		// SIGSTOP of the whole group) must not reach the guard. No
		// parent-death signal: when the caller dies the guard has work
		// to do.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	p := &Process{
		guard:    guard,
		conn:     conn,
		log:      log,
		exitCode: -1,
		done:     make(chan struct{}),
		gone:     make(chan struct{}),
	}
	if err := guard.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("supervise: starting the guard (%s): %w", guardExe, err)
	}
	theirs.Close()

	hello := encode(msgGrace, int64(grace))
	if cfg.DisableCgroup {
		hello = append(hello, encode(msgNoCgroup, 0)...)
	}
	if !cfg.Deadline.IsZero() {
		hello = append(hello, encode(msgDeadline, toMonotonic(cfg.Deadline))...)
	}
	hello = append(hello, encode(msgRun, 0)...)
	if err := p.write(hello); err != nil {
		p.abandon()
		return nil, fmt.Errorf("supervise: talking to the guard: %w", err)
	}
	if err := p.awaitStart(name); err != nil {
		return nil, err
	}
	go p.watch()
	log.Info("child started", "pid", p.pid, "guard", guard.Process.Pid, "cgroup", p.cgroup, "command", cfg.Command, "grace", grace)
	return p, nil
}

// awaitStart reads the guard's answer to msgRun.
func (p *Process) awaitStart(name string) error {
	_ = p.conn.SetReadDeadline(time.Now().Add(guardStartTimeout))
	defer p.conn.SetReadDeadline(time.Time{})
	for {
		m, err := readMessage(p.conn)
		if err != nil {
			p.abandon()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("supervise: the guard did not answer within %s; does the program call supervise.GuardMain first thing in main?", guardStartTimeout)
			}
			return fmt.Errorf("supervise: the guard exited before starting %q (does the program call supervise.GuardMain first thing in main?): %w", name, err)
		}
		switch m.typ {
		case msgCgroup:
			p.cgroup = m.str
		case msgStarted:
			p.pid = int(m.val)
			return nil
		case msgStartErr:
			p.abandon()
			return commandError(name, &os.PathError{Op: "exec", Path: name, Err: syscall.Errno(m.val)})
		}
	}
}

// abandon ends a guard that never ran a command.
func (p *Process) abandon() {
	p.conn.Close()
	_ = p.guard.Process.Kill()
	_ = p.guard.Wait()
}

// watch reads the guard's reports until it exits.
func (p *Process) watch() {
	for {
		m, err := readMessage(p.conn)
		if err != nil {
			break
		}
		switch m.typ {
		case msgReason:
			p.mu.Lock()
			p.reason = m.val
			p.mu.Unlock()
			switch m.val {
			case reasonDeadline:
				p.log.Warn("deadline passed without an extension; the guard is stopping the child", "pid", p.pid)
			case reasonSignal:
				p.log.Warn("the guard was signalled; it is stopping the child", "pid", p.pid)
			}
		case msgExited:
			p.exited(int(m.val))
		}
	}
	p.conn.Close()
	err := p.guard.Wait()
	p.exited(-1)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		// The guard exits 0 once its tree is gone; anything else means
		// it was killed (or crashed) and may have left descendants: the
		// command died with it (parent-death signal), but not what it
		// started. Kill what its process group and cgroup still hold.
		p.log.Error("the guard died; killing what is left of the child's process group and cgroup", "pid", p.pid, "err", err)
		p.killDirectly()
		p.mu.Lock()
		cg := p.cgroup
		p.mu.Unlock()
		if cg != "" {
			(&cgroup{dir: cg, fd: -1}).remove()
		}
	} else {
		p.log.Info("guard exited; the child and its descendants are gone", "pid", p.pid, "err", err)
	}
	close(p.gone)
}

// exited records the command's exit code (-1: unknown) once.
func (p *Process) exited(code int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	p.exitCode = code
	switch {
	case p.reason == reasonDeadline:
		p.err = fmt.Errorf("%w (exit status %d)", ErrDeadline, code)
	case code == -1:
		p.err = errors.New("supervise: the guard exited without reporting the command's status")
	case code > 128:
		p.err = fmt.Errorf("supervise: command killed by signal %v", syscall.Signal(code-128))
	case code != 0:
		p.err = fmt.Errorf("supervise: command exited with status %d", code)
	}
	p.log.Info("child exited", "pid", p.pid, "exit_code", code, "err", p.err)
	close(p.done)
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

// write sends b to the guard; a guard that does not read within
// writeTimeout is treated as gone.
func (p *Process) write(b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := p.conn.Write(b)
	return err
}

// toMonotonic converts t, which should carry a monotonic reading, to an
// absolute CLOCK_MONOTONIC time in nanoseconds.
func toMonotonic(t time.Time) int64 {
	return monotonicNow() + int64(time.Until(t))
}

// Pid returns the command's process id, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Done returns a channel closed once the command has exited. Its
// descendants may still be running; Stop removes them.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode returns the command's exit status once Done is closed, 128+N if
// it was killed by signal N, and -1 while it is still running or if its
// guard died without reporting it.
func (p *Process) ExitCode() int {
	select {
	case <-p.done:
		return p.exitCode
	default:
		return -1
	}
}

// Err returns nil while the command runs or if it exited with status 0 by
// itself, and otherwise an error that describes its end; it wraps
// ErrDeadline when the guard stopped it because the deadline passed.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Extend moves the deadline to deadline, which must carry a monotonic clock
// reading; an earlier deadline than the guard's current one is ignored. Call
// it after each confirmed renewal of the lease. It returns
// os.ErrProcessDone once the guard has exited.
func (p *Process) Extend(deadline time.Time) error {
	select {
	case <-p.gone:
		return os.ErrProcessDone
	default:
	}
	if err := p.write(encode(msgDeadline, toMonotonic(deadline))); err != nil {
		return fmt.Errorf("supervise: extending the deadline: %w", err)
	}
	return nil
}

// Signal sends sig to the command's whole process group, since signalling
// only the command would leave e.g. the real server behind a wrapper script
// untouched; the guard relays it. It returns os.ErrProcessDone once nothing
// is left to signal.
func (p *Process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("supervise: unsupported signal %v", sig)
	}
	if p.finished() {
		return os.ErrProcessDone
	}
	if err := p.write(encode(msgSignal, int64(s))); err != nil {
		return fmt.Errorf("supervise: signalling the child with %v: %w", sig, err)
	}
	p.log.Debug("signalled child process group", "pgid", p.pid, "signal", sig)
	return nil
}

// finished reports whether nothing is left of the command's process group.
func (p *Process) finished() bool {
	select {
	case <-p.gone:
		return true
	case <-p.done:
		// The guard reaps its children, so an empty group is ESRCH.
		return errors.Is(syscall.Kill(-p.pid, 0), syscall.ESRCH)
	default:
		return false
	}
}

// Stop stops the command and all its descendants: SIGTERM, then SIGKILL
// once Grace has passed since the first Stop call (and KillLead before the
// deadline at the latest), or as soon as ctx ends. It returns only when the
// guard has exited, which it does only once every descendant is gone, even
// if ctx has ended, because returning earlier would let the caller give up
// the lease while work may still be running. Descendants left behind by a
// command that already exited are stopped the same way, so call Stop even
// after Done is closed.
//
// When ctx ends, the caller also kills the command's process group and
// cgroup itself, and kills a guard that has not exited guardKillWait (1s)
// later: a guard that is stopped or hung must not keep Stop waiting.
//
// Stop returns ctx.Err() if ctx forced the escalation to SIGKILL and nil
// otherwise; the command's own outcome is reported by ExitCode and Err. Stop
// is idempotent and may be called concurrently.
func (p *Process) Stop(ctx context.Context) error {
	p.stopOnce.Do(func() {
		select {
		case <-p.gone:
			return
		default:
		}
		p.log.Info("stopping child", "pgid", p.pid, "signal", syscall.SIGTERM)
		if err := p.write(encode(msgStop, 0)); err != nil {
			p.log.Warn("asking the guard to stop the child failed", "pgid", p.pid, "err", err)
		}
	})
	select {
	case <-p.gone:
		return nil
	case <-ctx.Done():
	}
	err := ctx.Err()
	p.log.Warn("killing child and its descendants", "pgid", p.pid, "reason", "context ended: "+err.Error())
	p.killDirectly()
	_ = p.write(encode(msgKill, 0))
	t := time.NewTimer(guardKillWait)
	defer t.Stop()
	select {
	case <-p.gone:
		return err
	case <-t.C:
	}
	p.log.Error("the guard did not exit after SIGKILL of its child; killing the guard", "guard", p.guard.Process.Pid)
	p.killDirectly()
	_ = p.guard.Process.Kill()
	<-p.gone
	return err
}

// killDirectly kills the command's process group and cgroup without the
// guard's help.
func (p *Process) killDirectly() {
	select {
	case <-p.gone:
		return // the pgid may be reused by now
	default:
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	p.mu.Lock()
	cg := p.cgroup
	p.mu.Unlock()
	if cg != "" {
		_ = os.WriteFile(cg+"/cgroup.kill", []byte("1"), 0)
	}
}

// DefaultForwardSignals are the signals Forward relays when given none: the
// ones with an application-defined meaning (reload, reopen logs, dump state,
// terminal resize) that the command would have received had it not been
// moved out of the terminal's foreground process group.
func DefaultForwardSignals() []os.Signal {
	return []os.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGQUIT}
}

// Forward relays sigs received by this process to the command's process
// group until ctx ends or the returned stop function is called; with no sigs
// it relays DefaultForwardSignals. While forwarding, those signals no longer
// have their default effect on this process (SIGHUP and SIGQUIT would
// otherwise kill it). stop unregisters the relay with signal.Stop, waits for
// its goroutine to finish, and may be called more than once.
//
// SIGINT and SIGTERM are deliberately not in the default set: for baton they
// mean "stop", which should go through Stop so the lease is released after
// the command is gone.
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

// stripEnv returns env without the entries for key.
func stripEnv(env []string, key string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}
