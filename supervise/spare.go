//go:build linux || darwin

package supervise

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// spare is the guard that Prepare started ahead of its command, if any.
var spare struct {
	mu sync.Mutex
	p  *Process
}

// Prepare starts a guard ahead of the command it is to run, so that the next
// Start (or StartTerm) whose Stdin, Stdout and Stderr are these same files
// takes it instead of starting one: a guard is this program re-executed, and
// its start is most of what Start costs, a new term's command waiting for it.
// Only nil and *os.File streams can be prepared for, nil meaning /dev/null as
// in Config; others return an error. One guard is kept at a time: Prepare
// replaces an earlier one not yet taken. A prepared guard runs nothing until
// it is taken; it exits when Discard is called, or when this process dies.
// Prepare is safe for concurrent use.
func Prepare(stdin io.Reader, stdout, stderr io.Writer) error {
	cfg := Config{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	for _, s := range []any{stdin, stdout, stderr} {
		if !preparable(s) {
			return fmt.Errorf("supervise: Prepare takes nil or *os.File streams, not %T", s)
		}
	}
	p, err := startGuardProcess(cfg)
	if err != nil {
		return err
	}
	p.prepared = [3]any{stdin, stdout, stderr}
	spare.mu.Lock()
	old := spare.p
	spare.p = p
	spare.mu.Unlock()
	if old != nil {
		old.discard()
	}
	return nil
}

// Discard ends the guard that Prepare started, if it was not taken, and
// waits for it to exit. It is safe for concurrent use.
func Discard() {
	spare.mu.Lock()
	p := spare.p
	spare.p = nil
	spare.mu.Unlock()
	if p != nil {
		p.discard()
	}
}

// preparable reports whether s, a stream of Config, can be handed to a
// guard started ahead of the Config.
func preparable(s any) bool {
	switch f := s.(type) {
	case nil:
		return true
	case *os.File:
		return f != nil
	}
	return false
}

// takeSpare returns the prepared guard if it was started with cfg's
// streams, and forgets it; nil otherwise.
func takeSpare(cfg Config) *Process {
	want := [3]any{cfg.Stdin, cfg.Stdout, cfg.Stderr}
	for _, s := range want {
		if !preparable(s) {
			return nil
		}
	}
	spare.mu.Lock()
	defer spare.mu.Unlock()
	if spare.p == nil || spare.p.prepared != want {
		return nil
	}
	p := spare.p
	spare.p = nil
	return p
}

// discard ends a guard that was never given a command: it exits when its
// end of the socket closes.
func (p *Process) discard() {
	p.conn.Close()
	_ = p.guard.Wait()
	guardWaited(p.guard.Process.Pid)
}
