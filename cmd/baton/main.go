// Command baton runs leader-only work from the shell. Its commands:
//
//   - run: run a command only while this instance holds a lease
//   - cron: run a command on a cron schedule, on the leader only, at most
//     once per slot
//   - is-leader: exit 0 if this instance holds a lease (for scripts and
//     health checks)
//   - leader: print who holds a lease
//   - agent: run a raft member as a sidecar for agent:// clients, with its
//     HTTP API and status page
//   - tls: make the CA and member certificates of a raft group
//   - demo: a self-contained failover demo on this machine
//   - idle: do nothing until SIGTERM, the command of a baton run that only
//     holds the lease (a Kubernetes sidecar)
//   - version: print the version and the commit it was built from
//
// demo-job (hidden) is the job that demo's members run.
//
// Exit statuses are part of the contract that scripts and health checks rely
// on; they are listed in the help of each command and in exitCode below.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/supervise"
)

// Exit statuses. They are stable: scripts depend on them.
const (
	// exitOK: success; `is-leader`: this instance leads.
	exitOK = 0
	// exitFailure: `is-leader`: not the leader; `leader`: nobody leads;
	// otherwise a runtime error (the message says which).
	exitFailure = 1
	// exitUsage: bad flags, arguments, environment or backend URL.
	exitUsage = 2
	// exitUndetermined: the backend could not answer in time (`is-leader`,
	// `leader`), or `run --timeout` passed before this instance was elected.
	exitUndetermined = 3
	// exitLost: `run --once` lost the lease while the command ran.
	exitLost = 4
)

// exitError gives an error the exit status main reports for it. A nil err
// exits with code silently (e.g. `is-leader` answering "no").
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageErrorf reports a mistake of the caller's, exit status 2.
func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// exitCode maps an error returned by App.Run to the process exit status.
// Errors that carry no status are failures (1), except configuration errors
// from the library, which are usage errors (2): they come from flag values.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ce *baton.ConfigError
	if errors.As(err, &ce) {
		return exitUsage
	}
	return exitFailure
}

// signalError is the cancellation cause of the root context when baton got
// SIGTERM or SIGINT.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "received " + e.sig.String() }

// stoppedBySignal reports whether ctx ended because baton was asked to stop
// (a signal, or the instance leaving its Auto Scaling group), as opposed to
// a timeout or a lost term.
func stoppedBySignal(ctx context.Context) bool {
	var se *signalError
	var le *leavingError // the instance is leaving its group (--aws)
	return errors.As(context.Cause(ctx), &se) || errors.As(context.Cause(ctx), &le)
}

// App is the baton command line with its environment injected, so that tests
// run commands in-process. Nil fields mean the real process's.
type App struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer

	// LookupEnv reads BATON_* defaults for flags (os.LookupEnv).
	LookupEnv func(string) (string, bool)
	// Environ is the environment handed to children (os.Environ).
	Environ func() []string
	// Hostname names this host for `is-leader` without --id (os.Hostname).
	Hostname func() (string, error)
	// Executable is this binary, which `demo` starts copies of (os.Executable).
	Executable func() (string, error)

	// standby times the reports of `run` and `cron` while standing by
	// (zero: the defaults); tests shorten it.
	standby standbyPeriods

	// Subreaper makes `run` and `cron` call supervise.BecomeSubreaper, so
	// that the escaped descendants of a guard killed by another process
	// come to baton, which kills them before it lets the lease go. It is
	// process-wide: main sets it; in-process tests, whose test binary has
	// other children, do not.
	Subreaper bool
}

// Main runs the command line args (without the program name), prints any
// error on a.Stderr and returns the exit status.
func (a *App) Main(ctx context.Context, args []string) int {
	err := a.Run(ctx, args)
	var ee *exitError
	if err != nil && (!errors.As(err, &ee) || ee.err != nil) {
		fmt.Fprintf(a.stderr(), "baton: %v\n", err)
	}
	return exitCode(err)
}

func main() {
	// `baton run` starts each command under a guard: this binary again.
	supervise.GuardMain()
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-sigs
		// Only the first signal asks for an orderly stop (stop the child, then
		// resign). Restoring the default action lets a second Ctrl-C kill a
		// baton whose child ignores SIGTERM without waiting for --grace; the
		// child's guard then stops it (SIGKILL after --grace at the latest)
		// and the lease expires after its TTL.
		signal.Stop(sigs)
		cancel(&signalError{sig})
	}()
	app := &App{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Subreaper: true}
	os.Exit(app.Main(ctx, os.Args[1:]))
}

func (a *App) stdout() io.Writer {
	if a.Stdout == nil {
		return os.Stdout
	}
	return a.Stdout
}

func (a *App) stderr() io.Writer {
	if a.Stderr == nil {
		return os.Stderr
	}
	return a.Stderr
}

func (a *App) lookupEnv(key string) (string, bool) {
	if a.LookupEnv == nil {
		return os.LookupEnv(key)
	}
	return a.LookupEnv(key)
}

func (a *App) environ() []string {
	if a.Environ == nil {
		return os.Environ()
	}
	return a.Environ()
}

func (a *App) hostname() (string, error) {
	if a.Hostname == nil {
		return os.Hostname()
	}
	return a.Hostname()
}

func (a *App) executable() (string, error) {
	if a.Executable == nil {
		return os.Executable()
	}
	return a.Executable()
}
