package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ClientDialTimeout is how long a test's etcd client waits for a connection
// (its DialTimeout), so that a dead server fails the test quickly instead of
// at the test timeout. The typed clients are built by the tests of the
// modules that require etcd's client, so that this package stays
// stdlib-only.
const ClientDialTimeout = 2 * time.Second

// EtcdTool is the etcd server the tests run: etcd's own command
// (go.etcd.io/etcd/server/v3/etcdmain), built from the pinned module in
// tools/etcd, the version the backend's client is built against. It runs
// as a subprocess, so that no package of the main module links the server.
var EtcdTool = Tool{
	Name:    "etcd",
	Module:  "go.etcd.io/etcd/server/v3",
	Version: "v3.7.3",
	Package: "github.com/batonhq/baton/tools/etcd",
	Dir:     "tools/etcd",
}

// Raft timings of the test etcd. A lone member has no peers to heartbeat,
// so the tick only paces elections and lease bookkeeping; a short one lets
// the server come up in milliseconds. The election timeout is kept at 10
// ticks because etcd refuses lease TTLs below 1.5 election timeouts
// (rounded up to whole seconds): at the stock 1 s it would silently raise
// a 1 s TTL to 2 s, which breaks tests of fast failover.
const (
	etcdHeartbeat       = 10 * time.Millisecond
	etcdElectionTimeout = 100 * time.Millisecond
)

const (
	// etcdReadyTimeout bounds the wait for a new member to elect itself. It
	// is generous because a loaded CI machine may need seconds to write the
	// first WAL segment.
	etcdReadyTimeout = 30 * time.Second
	// etcdStopTimeout bounds a graceful stop, which may wait up to etcd's
	// request timeout for open client streams (watches, keep-alives) to end.
	etcdStopTimeout = 30 * time.Second
	// etcdBindAttempts is how often a start is retried when a port probed
	// free was taken by someone else before etcd bound it.
	etcdBindAttempts = 5
)

// Etcd is a single-member etcd server running as a subprocess of the test,
// on loopback, with fast raft timings, so that leases as short as one
// second are granted as asked.
type Etcd struct {
	cmd      *exec.Cmd
	dir      string
	endpoint string
	exited   chan struct{}
	waitErr  error
	once     sync.Once
}

// NewEtcd starts an etcd keeping its data in dir, for callers without a
// testing.TB such as TestMain. The caller must Close it. The binary comes
// from EtcdTool, built on first use; an error wrapping *ToolError means it
// could not be had.
//
// NewEtcd on the dir of an etcd that was closed brings back its keys and
// its leases, each with its full TTL again (TestEtcdRestartKeepsData), on a
// new port: clients that must follow it connect through a Proxy, which is
// then Retargeted, or the server is restarted with NewEtcdAt on its old
// address. Writes are not fsynced: a crash of the server process keeps what
// was written to the kernel, but a crash of the machine can lose
// acknowledged writes, which test data can afford.
func NewEtcd(dir string) (*Etcd, error) {
	return newEtcd(dir, "", nil)
}

// NewEtcdAt is NewEtcd serving clients on clientAddr ("127.0.0.1:PORT"),
// for a test that restarts a server where its clients already point.
func NewEtcdAt(dir, clientAddr string) (*Etcd, error) {
	return newEtcd(dir, clientAddr, nil)
}

func newEtcd(dir, clientAddr string, log *SyncBuffer, flags ...string) (*Etcd, error) {
	if dir == "" {
		return nil, errors.New("etcd: empty data dir")
	}
	bin, err := EtcdTool.Binary()
	if err != nil {
		return nil, &ToolError{Tool: EtcdTool, Err: err}
	}
	// etcd binds its listeners itself and cannot be handed ours, so free
	// ports are probed and released first. Another process may grab one in
	// between; etcd then exits saying so, and another roll is worth it.
	var lastErr error
	for range etcdBindAttempts {
		e, err := startEtcd(bin, dir, clientAddr, log, flags)
		if err == nil {
			return e, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("etcd: start in %s: %w", dir, lastErr)
}

func startEtcd(bin, dir, clientAddr string, log *SyncBuffer, flags []string) (*Etcd, error) {
	ports, err := freeTCPPorts(2)
	if err != nil {
		return nil, err
	}
	if clientAddr == "" {
		clientAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	}
	clientURL := "http://" + clientAddr
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	// Start-up output is kept whatever the caller's log, so that a failed
	// start can say why.
	out := new(SyncBuffer)
	var w io.Writer = out
	if log != nil {
		w = io.MultiWriter(out, log)
	}
	cmd := exec.Command(bin, append([]string{
		"--name=baton",
		"--data-dir=" + dir,
		"--heartbeat-interval=" + strconv.FormatInt(etcdHeartbeat.Milliseconds(), 10),
		"--election-timeout=" + strconv.FormatInt(etcdElectionTimeout.Milliseconds(), 10),
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=baton=" + peerURL,
		// Test data need not survive a crash of the machine, and fsync
		// would slow a CI disk down several times.
		"--unsafe-no-fsync",
		"--log-level=warn",
		"--log-outputs=stderr",
	}, flags...)...)
	// etcd reads its flags from ETCD_* variables too; the test's settings
	// are the flags above and nothing else.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout = w
	cmd.Stderr = w
	// Should the test binary die without its clean-up (a panic, a timeout),
	// the kernel kills the server rather than leaving it running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	e := &Etcd{cmd: cmd, dir: dir, endpoint: clientAddr, exited: make(chan struct{})}
	go func() {
		e.waitErr = cmd.Wait()
		close(e.exited)
	}()
	if err := e.awaitReady(clientURL, out); err != nil {
		e.kill()
		return nil, err
	}
	return e, nil
}

// awaitReady polls etcd's /health, which answers true once the member has
// elected itself and can serve a read through raft.
func (e *Etcd) awaitReady(clientURL string, out *SyncBuffer) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(etcdReadyTimeout)
	for {
		select {
		case <-e.exited:
			return fmt.Errorf("etcd exited during start-up (%v); its output:\n%s", e.waitErr, out)
		default:
		}
		if resp, err := hc.Get(clientURL + "/health"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"health":"true"`)) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not ready after %s (slow disk?); its output:\n%s", etcdReadyTimeout, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StartEtcd starts an etcd in a fresh t.TempDir and closes it when the test
// ends. etcd's warnings are kept back and shown only if the test fails. A
// binary that cannot be built goes through Unavailable (skip, or fail under
// BATON_REQUIRE_SERVERS=1); a server that fails to start fails the test.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	return StartEtcdFlags(t)
}

// StartEtcdFlags is StartEtcd with more flags for the server
// ("--max-txn-ops=8", say).
func StartEtcdFlags(t testing.TB, flags ...string) *Etcd {
	t.Helper()
	log := new(SyncBuffer)
	e, err := newEtcd(t.TempDir(), "", log, flags...)
	var te *ToolError
	if errors.As(err, &te) {
		Unavailable(t, "etcd", fmt.Errorf("%w\n%s", te.Err, EtcdTool.Hint()))
	}
	if err != nil {
		t.Fatalf("start etcd: %v\netcd log:\n%s", err, log)
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
func (e *Etcd) Endpoint() string { return e.endpoint }

// Dir returns the directory the server keeps its data in.
func (e *Etcd) Dir() string { return e.dir }

// Close stops the server with SIGTERM and waits for it to exit (killing it
// if it has not within 30 s). Tests may call it to simulate a server
// crash; calling it again (as the cleanup does) is harmless. Close clients
// first: a graceful stop waits for their open streams.
func (e *Etcd) Close() {
	e.once.Do(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(etcdStopTimeout):
			e.kill()
		}
	})
}

func (e *Etcd) kill() {
	_ = e.cmd.Process.Kill()
	<-e.exited
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
