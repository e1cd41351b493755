//go:build linux || darwin

package supervise

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// command is what the parent gives a guard before the command starts.
type command struct {
	path      string
	argv, env []string
	grace     int64
	deadline  int64
	noCgroup  bool
	heard     bool   // any message came
	rest      []byte // read after msgRun: the loop's
	err       error
}

// The states of a commandWait: whichever of the command and a signal comes
// first decides.
const (
	waiting int32 = iota
	given
	signalled
)

// commandWait reads a guard's command on the calling thread, or learns
// that the guard was told to stop (SIGTERM, SIGINT) before it came.
type commandWait struct {
	// sigs receives the stop signals that come once the command is given:
	// the guard's loop reads them.
	sigs chan os.Signal

	state atomic.Int32
	// A signal while waiting writes to stopW, which ends the poll(2) that
	// the waiting thread sleeps in.
	stopR, stopW *os.File
}

// errSignalled ends a read of the command: a stop signal came first.
var errSignalled = errors.New("supervise: the guard was signalled while it waited for its command")

// newCommandWait relays in, the guard's stop signals, to the wait while it
// waits and to sigs after.
func newCommandWait(in <-chan os.Signal) (*commandWait, error) {
	r, w, err := os.Pipe() // close-on-exec: the command does not inherit it
	if err != nil {
		return nil, fmt.Errorf("pipe: %w", err)
	}
	cw := &commandWait{sigs: make(chan os.Signal, 1), stopR: r, stopW: w}
	go func() {
		for s := range in {
			if cw.state.CompareAndSwap(waiting, signalled) {
				_, _ = cw.stopW.Write([]byte{0})
				continue
			}
			select {
			case cw.sigs <- s:
			default: // one is pending already: the loop stops either way
			}
		}
	}()
	return cw, nil
}

// read reads the command from the socket to the parent, until msgRun,
// or returns signalled when a stop signal came first.
func (cw *commandWait) read() (c command, stopped bool) {
	br := bufio.NewReaderSize(&pollReader{fd: guardFD, stop: int(cw.stopR.Fd())}, 64<<10)
	for {
		m, err := readMessage(br)
		if errors.Is(err, errSignalled) {
			return c, true
		}
		if err != nil {
			c.err = err
			return c, false
		}
		c.heard = true
		switch m.typ {
		case msgPath:
			c.path = m.str
		case msgArg:
			c.argv = append(c.argv, m.str)
		case msgEnv:
			c.env = append(c.env, m.str)
		case msgGrace:
			c.grace = m.val
		case msgNoCgroup:
			c.noCgroup = true
		case msgDeadline:
			c.deadline = m.val
		case msgRun:
			c.rest = make([]byte, br.Buffered())
			_, _ = io.ReadFull(br, c.rest)
			if !cw.state.CompareAndSwap(waiting, given) {
				return c, true
			}
			// From here on the relay sends to sigs and never writes to
			// the pipe.
			cw.stopR.Close()
			cw.stopW.Close()
			return c, false
		}
	}
}

// pollReader reads a non-blocking descriptor, waiting for it in poll(2) on
// the calling thread; a readable stop descriptor ends the wait with
// errSignalled.
type pollReader struct{ fd, stop int }

func (r *pollReader) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, b)
		switch {
		case err == nil && n == 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case errors.Is(err, unix.EINTR):
			continue
		case !errors.Is(err, unix.EAGAIN):
			return 0, err
		}
		fds := []unix.PollFd{{Fd: int32(r.fd), Events: unix.POLLIN}, {Fd: int32(r.stop), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, err
		}
		if fds[1].Revents != 0 {
			return 0, errSignalled
		}
	}
}
