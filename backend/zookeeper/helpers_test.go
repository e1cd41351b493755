package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/go-zookeeper/zk"
)

// quiet drops go-zookeeper's log lines (every reconnection attempt, which
// partition tests provoke on purpose).
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// connect returns a client of the server at addr with cfg's TTL as session
// timeout, dialing through a SessionProbe and handing its events to a
// Watches (which newBackend gives the Backend), closed when the test ends.
func connect(t testing.TB, addr string, cfg backend.Config) (*zk.Conn, *zookeeper.SessionProbe) {
	t.Helper()
	cfg, err := cfg.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	probe := zookeeper.NewSessionProbe(nil)
	w := zookeeper.NewWatches()
	conn, _, err := zk.Connect([]string{addr}, cfg.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}), zk.WithEventCallback(w.Callback))
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	watchesOf.Store(conn, w)
	t.Cleanup(conn.Close)
	return conn, probe
}

// watchesOf holds the Watches that connect wired into each client.
var watchesOf sync.Map

// rawConn returns a plain client, for looking at and meddling with the
// tree as an operator or another program would.
func rawConn(t testing.TB, addr string) *zk.Conn {
	t.Helper()
	conn, _ := connect(t, addr, backend.Config{TTL: 4 * time.Second})
	return conn
}

// newBackend returns a Backend on conn, closed when the test ends (before
// the conn, since cleanups run last-in first-out). Options.Watches, if nil,
// is the one connect wired into conn.
func newBackend(t testing.TB, conn *zk.Conn, opts zookeeper.Options) *zookeeper.Backend {
	t.Helper()
	if w, ok := watchesOf.Load(conn); ok && opts.Watches == nil {
		opts.Watches = w.(*zookeeper.Watches)
	}
	return newBackendAsIs(t, conn, opts)
}

// newBackendAsIs is newBackend with opts as given: without Watches, a
// goroutine per held lease waits for its node's watch.
func newBackendAsIs(t testing.TB, conn *zk.Conn, opts zookeeper.Options) *zookeeper.Backend {
	t.Helper()
	b, err := zookeeper.New(conn, opts)
	if err != nil {
		t.Fatalf("zookeeper.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, dead := killed.Load(conn); dead {
			// A killed process's client is closed: Close could only try
			// its deletes until the context ends.
			cancel()
		}
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

// killed holds the clients of processes the test killed (see kill).
var killed sync.Map

// kill closes conn as the death of its process would, after the test cut
// it off, and marks it so that its Backend's clean-up does not wait.
func kill(conn *zk.Conn) {
	killed.Store(conn, struct{}{})
	conn.Close()
}

// dial returns a Backend from Dial, closed when the test ends.
func dial(t testing.TB, addr string, opts zookeeper.DialOptions) *zookeeper.Backend {
	t.Helper()
	b, err := zookeeper.Dial(testkit.Context(t, 10*time.Second), []string{addr}, opts)
	if err != nil {
		t.Fatalf("zookeeper.Dial %s: %v", addr, err)
	}
	return testkit.CloseAtEnd(t, b, 5*time.Second)
}

// uniqueRoot returns a root path of the test's own on the shared server.
func uniqueRoot(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "/t-" + hex.EncodeToString(b[:])
}

// children returns the children of path, or nil if it does not exist.
func children(t testing.TB, conn *zk.Conn, path string) []string {
	t.Helper()
	c, _, err := conn.Children(path)
	if err != nil && err != zk.ErrNoNode {
		t.Fatalf("children of %s: %v", path, err)
	}
	return c
}
