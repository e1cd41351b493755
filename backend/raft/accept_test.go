package raft

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// emfileListener fails its first fails Accepts as a process out of file
// descriptors does, then accepts as its listener does.
type emfileListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// A member that runs out of file descriptors for a moment keeps serving its
// group once they are back, instead of closing its listeners for good.
func TestAcceptSurvivesRunningOutOfFiles(t *testing.T) {
	ca := testCA(t)
	cfg, err := ca.Config("acceptor", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &emfileListener{Listener: inner}
	ln.fails.Store(5)
	rec := &attrRecorder{}
	m := &mux{
		ln: ln, creds: newCreds(cfg, testSecret), inGroup: func() bool { return false },
		refusals: newRefusalLog(slog.New(rec), time.Minute), timeout: 5 * time.Second,
		raft: newChanListener(ln.Addr()), api: newChanListener(ln.Addr()),
	}
	m.start()
	t.Cleanup(func() { _ = m.close() })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dialProto(ctx, newCreds(clientConfig(t, ca), testSecret), nil, inner.Addr().String(), protoAPI)
	if err != nil {
		t.Fatalf("dial after the accept errors: %v", err)
	}
	defer c.Close()
	acceptOne(t, m.api, 10*time.Second).Close()
	if n := ln.fails.Load(); n >= 0 {
		t.Fatalf("the listener still had %d failures to give: the test did not exercise them", n+1)
	}
}
