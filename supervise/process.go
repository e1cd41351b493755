//go:build linux || darwin

package supervise

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/proctree"
)

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
// When ctx ends, the caller kills the command's tree itself: it resumes the
// guard (SIGCONT), kills the command's process group and cgroup, and sends
// SIGKILL to every process below the guard until none is left alive. Only
// then, if the guard has still not exited guardKillWait (1s) later (it is
// hung), does it kill the guard: while the guard lives, nothing below it can
// leave its tree, since it is their subreaper, whereas its death would hand
// what is left to init. A process below the guard that SIGKILL does not end
// (uninterruptible sleep; another user's) keeps Stop waiting, and it says so
// in the log.
//
// Stop returns ctx.Err() if ctx forced the escalation to SIGKILL, an error
// wrapping ErrDescendantsLost if the guard was killed by someone else and
// descendants may have escaped, and nil otherwise; the command's own
// outcome is reported by ExitCode and Err. Stop is idempotent and may be
// called concurrently.
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
		return p.lostErr(nil)
	case <-ctx.Done():
	}
	err := ctx.Err()
	p.log.Warn("killing child and its descendants", "pgid", p.pid, "reason", "context ended: "+err.Error())
	p.killTree()
	_ = p.write(encode(msgKill, 0))
	t := time.NewTimer(guardKillWait)
	defer t.Stop()
	select {
	case <-p.gone:
		return p.lostErr(err)
	case <-t.C:
	}
	p.log.Error("the guard did not exit after SIGKILL of its tree; killing the guard", "guard", p.guard.Process.Pid)
	p.killTree()
	p.mu.Lock()
	p.treeKilled = true
	p.mu.Unlock()
	_ = p.guard.Process.Kill()
	<-p.gone
	return p.lostErr(err)
}

// lostErr returns err, joined with ErrDescendantsLost if the guard's death
// lost track of descendants.
func (p *Process) lostErr(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lost == nil {
		return err
	}
	if err == nil {
		return p.lost
	}
	return errors.Join(err, p.lost)
}

// killTree kills everything below the guard without the guard's help, and
// returns once no process below it is alive (zombies aside) on two scans in
// a row, or once the guard is gone. The guard is resumed first, in case it
// was stopped, to do its part.
func (p *Process) killTree() {
	if p.guard.Process.Signal(syscall.SIGCONT) != nil {
		return // gone already: its pid may be reused
	}
	p.killDirectly()
	g := p.guard.Process.Pid
	warn := time.Now().Add(time.Second)
	for empty := 0; empty < 2; {
		select {
		case <-p.gone:
			return
		default:
		}
		ds := proctree.Descendants(g)
		if len(ds) == 0 {
			empty++
			continue
		}
		empty = 0
		for _, d := range ds {
			_ = syscall.Kill(d.PID, syscall.SIGKILL)
		}
		if time.Now().After(warn) {
			p.log.Error("processes below the guard survive SIGKILL (uninterruptible sleep, or another user's); the guard is kept alive, and the lease held, until they are gone", "guard", g, "left", len(ds))
			warn = time.Now().Add(orphanWarnEvery)
		}
		select {
		case <-p.gone:
			return
		case <-time.After(killRetry):
		}
	}
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
// otherwise kill it). stop ends the relay, returns once no signal is
// relayed any more (unregistering it with signal.Stop follows), and may be
// called more than once.
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
		// The relay has ended once finished closes; signal.Stop, which
		// waits for the runtime's signal delivery to go idle (a
		// millisecond, at the end of a term), comes after it, so that
		// stop need not wait for it.
		defer signal.Stop(ch)
		defer close(finished)
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
