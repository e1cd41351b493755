// Package etcdserver runs a single-member etcd inside the current process.
//
// It exists so that `baton demo`, benchmarks and tests can all get a real
// etcd without an installed binary. It deliberately does not import
// "testing": production commands link it. The test-facing wrapper lives in
// internal/testserver.
package etcdserver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Defaults applied by Start when the corresponding Options field is zero.
const (
	// DefaultHeartbeat is the raft tick. A lone member has no peers to
	// heartbeat, so the tick only paces elections and lease bookkeeping;
	// keeping it short lets the server come up in milliseconds.
	DefaultHeartbeat = 10 * time.Millisecond

	// DefaultElectionTimeout is kept at 10 ticks because etcd refuses lease
	// TTLs below 1.5 election timeouts (rounded up to whole seconds): at the
	// stock 1 s it would silently raise a 1 s TTL to 2 s, which breaks tests
	// and demos of fast failover.
	DefaultElectionTimeout = 100 * time.Millisecond

	// DefaultReadyTimeout bounds how long Start waits for the member to elect
	// itself. It is generous because a loaded CI machine may need seconds to
	// fsync the first WAL segment.
	DefaultReadyTimeout = 30 * time.Second
)

// bindAttempts is how often Start retries when a port it picked at random
// was taken by someone else between probing and etcd binding it.
const bindAttempts = 5

// Options tunes Start. The zero value is a silent member on random loopback
// ports with the Default* timings.
type Options struct {
	// ClientAddr is the host:port clients connect to. Empty means a random
	// free port on 127.0.0.1; set it when humans need a predictable address
	// (for etcdctl during a demo).
	ClientAddr string

	// Heartbeat is the raft tick; zero means DefaultHeartbeat.
	Heartbeat time.Duration

	// ElectionTimeout must be at least five heartbeats (an etcd rule); zero
	// means DefaultElectionTimeout.
	ElectionTimeout time.Duration

	// ReadyTimeout bounds the wait for the server to become ready; zero means
	// DefaultReadyTimeout.
	ReadyTimeout time.Duration

	// Log receives etcd's warnings and errors, one line each. Nil discards
	// them: etcd is chatty even when healthy, and its output would drown the
	// caller's own.
	Log io.Writer

	// UnsafeNoFsync skips fsync on the WAL and backend. Only for throwaway
	// data: it makes tests several times faster on slow disks, and a crash
	// can lose acknowledged writes.
	UnsafeNoFsync bool
}

// Server is a running single-member etcd. Its methods are safe for
// concurrent use.
type Server struct {
	etcd      *embed.Etcd
	endpoint  string
	closeOnce sync.Once
}

// Start runs an etcd member that keeps its data in dir and returns once it
// is ready to serve clients. Starting again on the same dir resumes the
// data written before. Call Close to release the ports and the dir lock.
func Start(dir string, opts Options) (*Server, error) {
	if dir == "" {
		return nil, errors.New("etcdserver: empty data dir")
	}
	if opts.Heartbeat == 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.ElectionTimeout == 0 {
		opts.ElectionTimeout = DefaultElectionTimeout
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = DefaultReadyTimeout
	}

	// etcd binds its listeners itself and cannot be handed ours, so a free
	// port is probed and released first. Another process may grab it in
	// between; that shows up as EADDRINUSE and is worth another roll.
	var lastErr error
	for range bindAttempts {
		e, endpoint, err := start(dir, opts)
		if err == nil {
			return waitReady(e, endpoint, opts.ReadyTimeout)
		}
		lastErr = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("etcdserver: start in %s: %w", dir, lastErr)
}

func start(dir string, opts Options) (*embed.Etcd, string, error) {
	clientAddr := opts.ClientAddr
	if clientAddr == "" {
		var err error
		if clientAddr, err = freeLoopbackAddr(); err != nil {
			return nil, "", err
		}
	}
	peerAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: clientAddr}
	peerURL := url.URL{Scheme: "http", Host: peerAddr}

	cfg := embed.NewConfig()
	cfg.Name = "baton"
	cfg.Dir = dir
	cfg.TickMs = uint(opts.Heartbeat.Milliseconds())
	cfg.ElectionMs = uint(opts.ElectionTimeout.Milliseconds())
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = opts.UnsafeNoFsync
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newLogger(opts.Log))

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	return e, clientAddr, nil
}

func waitReady(e *embed.Etcd, endpoint string, timeout time.Duration) (*Server, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return &Server{etcd: e, endpoint: endpoint}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcdserver: failed before becoming ready: %w", err)
	case <-e.Server.StopNotify():
		e.Close()
		return nil, errors.New("etcdserver: stopped before becoming ready")
	case <-timer.C:
		e.Close()
		return nil, fmt.Errorf("etcdserver: not ready after %s (slow disk? pass Options.Log to see why)", timeout)
	}
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free loopback port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

func newLogger(w io.Writer) *zap.Logger {
	if w == nil {
		return zap.NewNop()
	}
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), zapcore.WarnLevel))
}

// Endpoint returns the client address as "127.0.0.1:PORT", the form
// clientv3.Config.Endpoints expects.
func (s *Server) Endpoint() string { return s.endpoint }

// Close stops the server and waits for its goroutines. It may wait up to
// etcd's request timeout for open client streams (watches, keep-alives) to
// end, so close clients first. Close is idempotent.
func (s *Server) Close() {
	// embed.Etcd.Close closes its error channel and panics the second time.
	s.closeOnce.Do(s.etcd.Close)
}

// Err reports an error etcd hit while serving after Start returned; the
// channel is closed once the server has stopped. Long-running callers such
// as `baton demo` select on it to notice a dying server.
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Stopped is closed when the server has stopped serving, whether through
// Close or an internal failure.
func (s *Server) Stopped() <-chan struct{} { return s.etcd.Server.StopNotify() }
