package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// A close that hangs past its context does not keep the process: it is
// given up on after closeOverrun, and the log names it and where it hangs.
func TestCloseWithinGivesUpOnAHungClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := newLockedWriter()
		log := slog.New(slog.NewTextHandler(out, nil))
		release := make(chan struct{})
		defer close(release)
		start := time.Now()
		err := closeWithin(context.Background(), 2*time.Second, "the thing", log, func(ctx context.Context) error {
			<-release // ignores ctx, as a hung library call would
			return nil
		})
		if err != nil {
			t.Fatalf("closeWithin: %v, want nil (the hang is logged)", err)
		}
		if waited, want := time.Since(start), 2*time.Second+closeOverrun; waited != want {
			t.Fatalf("gave up after %s, want %s", waited, want)
		}
		logged := out.String()
		for _, want := range []string{"closing the thing did not finish", "TestCloseWithinGivesUpOnAHungClose"} {
			if !strings.Contains(logged, want) {
				t.Errorf("log lacks %q:\n%s", want, logged)
			}
		}
	})
}

// A close that ends within its context returns its own result, and one that
// ends during the overrun is still waited for.
func TestCloseWithinWaitsForAClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := newLockedWriter()
		log := slog.New(slog.NewTextHandler(out, nil))
		boom := errors.New("boom")
		if err := closeWithin(context.Background(), time.Second, "a", log, func(context.Context) error { return boom }); err != boom {
			t.Fatalf("closeWithin: %v, want boom", err)
		}
		start := time.Now()
		err := closeWithin(context.Background(), time.Second, "b", log, func(ctx context.Context) error {
			<-ctx.Done()
			time.Sleep(closeOverrun / 2) // a last step after the deadline
			return ctx.Err()
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("closeWithin: %v, want the close's DeadlineExceeded", err)
		}
		if waited, want := time.Since(start), time.Second+closeOverrun/2; waited != want {
			t.Fatalf("returned after %s, want %s", waited, want)
		}
		if out.String() != "" {
			t.Fatalf("logged %q, want nothing", out.String())
		}
	})
}

// lockedWriter is a bytes.Buffer that many goroutines (or a child
// process's output copier and a test) may write and read.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

func newLockedWriter() *lockedWriter { return &lockedWriter{w: new(bytes.Buffer)} }

// SIGTERM while baton is still connecting to its backend stops it with
// status 0, as SIGTERM does at any other moment: nothing ran, nothing is
// left to hand over.
func TestRunSIGTERMWhileConnecting(t *testing.T) {
	// A server that closes every connection it accepts: the ZooKeeper
	// client's handshakes fail and it keeps retrying, so baton stays
	// connecting. The first accepted connection shows that baton got that
	// far.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dialed := make(chan struct{})
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		var once sync.Once
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			once.Do(func() { close(dialed) })
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-accepting })
	p := startBaton(t, "baton", testEnv(), "run", "--backend", "zk://"+ln.Addr().String(), "--lease", "x", "--id", "a",
		"--log-level", "debug", "--", "true")
	select {
	case <-dialed:
	case <-p.done:
		t.Fatalf("baton exited before dialing its backend:\n%s", p.out)
	case <-time.After(30 * time.Second):
		t.Fatalf("baton did not dial its backend within 30s:\n%s", p.out)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit status %d after SIGTERM while connecting, want 0:\n%s", code, p.out)
	}
	if !strings.Contains(p.out.String(), "stopped before connecting") {
		t.Errorf("no \"stopped before connecting\" in the log:\n%s", p.out)
	}
}
