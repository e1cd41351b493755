//go:build linux || darwin

package supervise

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
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
	conn  *os.File   // the socket to the guard
	wmu   sync.Mutex // one message at a time on conn
	pid   int
	log   *slog.Logger

	stopOnce sync.Once
	goneOnce sync.Once // closes gone

	// outDirect: the command's Stdout and Stderr are files (or discarded),
	// so that no output is still being copied once its tree is gone.
	outDirect bool

	// prepared are the streams of a guard started by Prepare, not yet
	// given a command.
	prepared [3]any

	mu     sync.Mutex
	cgroup string // the command's cgroup directory, or ""
	reason int64  // why the guard stopped the command on its own, or 0
	lost   error  // ErrDescendantsLost, once known
	// treeKilled: the caller killed everything below the guard before it
	// killed the guard (Stop), so the guard's death lost nothing.
	treeKilled bool
	exitCode   int   // valid once done is closed
	err        error // valid once done is closed

	done chan struct{} // the command exited (or the guard did)
	gone chan struct{} // the command's tree is gone: the guard said so, or exited
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

	spare := takeSpare(cfg)
	for {
		p := spare
		if p == nil {
			var err error
			if p, err = startGuardProcess(cfg); err != nil {
				return nil, err
			}
		}
		p.log = log
		env := cfg.Env
		if env == nil {
			env = os.Environ()
		}
		hello := encode(msgGrace, int64(grace))
		if cfg.DisableCgroup {
			hello = append(hello, encode(msgNoCgroup, 0)...)
		}
		if !cfg.Deadline.IsZero() {
			hello = append(hello, encode(msgDeadline, toMonotonic(cfg.Deadline))...)
		}
		hello = append(hello, encodeString(msgPath, path.Path)...)
		for _, a := range cfg.Command {
			hello = append(hello, encodeString(msgArg, a)...)
		}
		for _, kv := range env {
			hello = append(hello, encodeString(msgEnv, kv)...)
		}
		hello = append(hello, encode(msgRun, 0)...)
		// Both abandon the guard on failure.
		err := p.write(hello)
		if err != nil {
			p.abandon()
			err = fmt.Errorf("supervise: talking to the guard: %w", err)
		} else {
			err = p.awaitStart(name)
		}
		var ce *commandStartError
		switch {
		case err != nil && spare != nil && !errors.As(err, &ce):
			// The spare died while it waited (killed, say): a new one.
			log.Warn("the guard started ahead of the command is gone; starting another", "err", err)
			spare = nil
			continue
		case errors.As(err, &ce):
			return nil, ce.err
		case err != nil:
			return nil, err
		}
		go p.watch()
		log.Info("child started", "pid", p.pid, "guard", p.guard.Process.Pid, "cgroup", p.cgroup, "command", cfg.Command, "grace", grace, "prepared", p == spare)
		return p, nil
	}
}

// startGuardProcess starts a guard, which waits for its command.
func startGuardProcess(cfg Config) (*Process, error) {
	exe, err := guardExe()
	if err != nil {
		return nil, fmt.Errorf("supervise: finding this program's file to start the guard: %w", err)
	}
	fds, err := socketpair()
	if err != nil {
		return nil, fmt.Errorf("supervise: socket for the guard: %w", err)
	}
	// Non-blocking, so that the File is pollable and its deadlines work.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, fmt.Errorf("supervise: socket for the guard: %w", err)
	}
	conn := os.NewFile(uintptr(fds[0]), "supervise-guard")
	theirs := os.NewFile(uintptr(fds[1]), "supervise-guard")
	defer theirs.Close()
	guard := &exec.Cmd{
		Path: exe,
		Args: []string{guardName},
		// The guard's own environment; the command's comes over the socket.
		Env:        append(os.Environ(), guardEnv+"=1"),
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
		outDirect: preparable(cfg.Stdout) && preparable(cfg.Stderr),
		guard:     guard,
		conn:      conn,
		log:       slog.New(slog.DiscardHandler),
		exitCode:  -1,
		done:      make(chan struct{}),
		gone:      make(chan struct{}),
	}
	if err := startGuard(guard); err != nil {
		conn.Close()
		return nil, fmt.Errorf("supervise: starting the guard (%s): %w", exe, err)
	}
	return p, nil
}

// commandStartError is the guard's report that the command could not be
// started.
type commandStartError struct{ err error }

func (e *commandStartError) Error() string { return e.err.Error() }
func (e *commandStartError) Unwrap() error { return e.err }

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
			return &commandStartError{commandError(name, &os.PathError{Op: "exec", Path: name, Err: syscall.Errno(m.val)})}
		}
	}
}

// abandon ends a guard that never ran a command.
func (p *Process) abandon() {
	p.conn.Close()
	_ = p.guard.Process.Kill()
	_ = p.guard.Wait()
	guardWaited(p.guard.Process.Pid)
}

// watch reads the guard's reports until it exits.
func (p *Process) watch() {
	reported := false // msgGone came
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
		case msgGone:
			// The guard found nothing left below it: its own exit adds
			// nothing to that, and takes a millisecond or more. Output
			// copied through pipes is complete only once it has exited.
			reported = true
			if p.outDirect {
				p.exited(-1)
				p.log.Info("the child and its descendants are gone", "pid", p.pid)
				p.goneOnce.Do(func() { close(p.gone) })
			}
		}
	}
	p.conn.Close()
	err := p.guard.Wait()
	guardWaited(p.guard.Process.Pid)
	var ee *exec.ExitError
	if reported {
		// How the guard ended after it said so changes nothing.
		err = nil
	}
	if errors.As(err, &ee) {
		// The guard exits 0 once its tree is gone; anything else means
		// it was killed (or crashed) and may have left descendants: the
		// command died with it (parent-death signal), but not what it
		// started. Kill what its process group and cgroup still hold,
		// and, as a subreaper, what was re-parented to this process.
		p.log.Error("the guard died; killing what is left of the child's tree", "pid", p.pid, "err", err)
		p.mu.Lock()
		cg, killed := p.cgroup, p.treeKilled
		p.mu.Unlock()
		p.killDirectly()
		if cg != "" {
			(&cgroup{dir: cg, fd: -1}).killAll(p.log)
		}
		switch {
		case subreaper():
			reapOrphans(p.log)
			p.log.Info("what the guard left behind is gone", "pid", p.pid)
		case cg == "" && !killed:
			p.mu.Lock()
			p.lost = ErrDescendantsLost
			p.mu.Unlock()
			p.log.Error("descendants of the child that left its process group may still run, and cannot be found: the guard was killed, the child has no cgroup, and this process is not a subreaper", "pid", p.pid)
		}
	} else if !p.outDirect || !reported {
		p.log.Info("the child and its descendants are gone", "pid", p.pid, "err", err)
	}
	p.exited(-1)
	p.goneOnce.Do(func() { close(p.gone) })
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
	case code == -1 && p.lost != nil:
		p.err = p.lost
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
