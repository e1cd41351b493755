package testserver

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/etcdserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ClientDialTimeout bounds how long EtcdClient waits for a connection, so a
// dead server fails the test quickly instead of at the test timeout.
const ClientDialTimeout = 2 * time.Second

// Etcd is a single-member etcd running in this process with fast raft timings,
// so that leases as short as one second are granted as asked.
type Etcd struct {
	srv *etcdserver.Server
}

// NewEtcd starts an etcd keeping its data in dir, for callers without a
// testing.TB such as TestMain. The caller must Close it.
//
// NewEtcd on the dir of an etcd that was closed brings back its keys and
// its leases, each with its full TTL again (TestEtcdRestartKeepsData), on a
// new port: clients that must follow it connect through a Proxy, which is
// then Retargeted. Writes are not fsynced: the server runs inside this
// process, so it cannot crash alone, and a crash of the process keeps what
// was written to the kernel, but a crash of the machine can lose
// acknowledged writes.
func NewEtcd(dir string) (*Etcd, error) {
	return newEtcd(dir, nil)
}

func newEtcd(dir string, log *SyncBuffer) (*Etcd, error) {
	// Test data need not survive a crash of the machine, and fsync would
	// slow a CI disk down several times.
	opts := etcdserver.Options{UnsafeNoFsync: true}
	// A nil *SyncBuffer stored in opts.Log would be a non-nil io.Writer.
	if log != nil {
		opts.Log = log
	}
	srv, err := etcdserver.Start(dir, opts)
	if err != nil {
		return nil, err
	}
	return &Etcd{srv: srv}, nil
}

// StartEtcd starts an etcd in a fresh t.TempDir and closes it when the test
// ends. etcd's warnings are kept back and shown only if the test fails.
//
// Failing to start fails the test rather than going through Unavailable:
// etcd is compiled in, so it cannot be missing, and a skip would hide a bug.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	log := new(SyncBuffer)
	e, err := newEtcd(t.TempDir(), log)
	if err != nil {
		t.Fatalf("start embedded etcd: %v\netcd log:\n%s", err, log)
	}
	// Cleanups run last-in first-out: dump the log after Close so that
	// shutdown trouble is included.
	t.Cleanup(func() {
		if t.Failed() && log.Len() > 0 {
			t.Logf("etcd log:\n%s", log)
		}
	})
	t.Cleanup(e.Close)
	return e
}

// Endpoint returns the server's client address, "127.0.0.1:PORT".
func (e *Etcd) Endpoint() string { return e.srv.Endpoint() }

// Client returns a client connected straight to the server, closed when the
// test ends.
func (e *Etcd) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return EtcdClient(t, e.Endpoint())
}

// Close stops the server. Tests may call it to simulate a server crash;
// calling it again (as the cleanup does) is harmless.
func (e *Etcd) Close() { e.srv.Close() }

// EtcdClient returns a client for the etcd at endpoint, closed when the test
// ends. Point it at a Proxy's Addr to get a client that can be cut off.
func EtcdClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: ClientDialTimeout,
		// The client logs every reconnect attempt, which partition tests
		// provoke on purpose.
		Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client for %s: %v", endpoint, err)
	}
	t.Cleanup(func() {
		// Close cancels the client's streams; its error only repeats that.
		_ = c.Close()
	})
	return c
}

// SyncBuffer is a bytes.Buffer safe for concurrent use: etcd's log lines, or
// a command's output copied by several goroutines, arrive while the test
// goroutine may read them. The zero value is ready to use.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Len returns the number of bytes written so far.
func (b *SyncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
