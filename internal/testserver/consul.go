package testserver

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ConsulTool is the consul binary the tests run, built from the pinned
// module in tools/consul. The module needs GONOSUMDB for one dependency
// that is missing from the checksum database.
var ConsulTool = Tool{
	Name:    "consul",
	Module:  "github.com/hashicorp/consul",
	Version: "v1.20.6",
	Package: "github.com/hashicorp/consul",
	Dir:     "tools/consul",
	Env:     []string{"GONOSUMDB=github.com/hashicorp/consul-awsauth"},
}

// ConsulSessionTTLMin is the agent's session_ttl_min. Consul refuses
// session TTLs below it (10 s by default); the tests need sub-second ones,
// since baton asks Consul for TTL/2 and the conformance suite runs with a
// one-second TTL.
const ConsulSessionTTLMin = 100 * time.Millisecond

// consulStopTimeout bounds how long Close waits for a Persist server to
// shut down after SIGTERM before it kills it.
const consulStopTimeout = 30 * time.Second

// consulStartTimeout bounds an agent's start: the HTTP API answering and a
// raft leader elected. A -dev agent takes well under a second when idle,
// but seconds on a loaded two-core CI machine.
const consulStartTimeout = 60 * time.Second

// ConsulOptions configures NewConsul. The zero value starts a plain -dev
// agent serving HTTP.
type ConsulOptions struct {
	// ACL enables ACLs with default policy "deny"; ManagementToken returns
	// the bootstrap (initial management) token.
	ACL bool
	// TLS serves the HTTP API over HTTPS only, with a certificate for
	// 127.0.0.1 from a fresh CA, and requires client certificates from that
	// CA; TLSFiles returns the client's files.
	TLS bool
	// Persist runs a real single server (`-server -bootstrap-expect=1`,
	// data in DIR/data) instead of a -dev agent, whose data lives in
	// memory: Close, then NewConsul on the same dir with the same options,
	// brings back the KV store, the sessions and the ACL token. The server
	// keeps its ports across restarts, since raft remembers its own
	// address; they are saved in DIR/consul-state.json on the first start,
	// and a restart fails with an error naming the port if one is taken.
	// With TLS, the certificates of the first start are reused too.
	Persist bool
	// HTTPMaxConnsPerClient, if not zero, is the agent's
	// limits.http_max_conns_per_client (Consul's default: 200). Every
	// blocking query holds a connection, and every test client connects
	// from 127.0.0.1.
	HTTPMaxConnsPerClient int
}

// Consul is a `consul agent -dev` (an in-memory single-server datacenter),
// or with ConsulOptions.Persist a single server keeping its data on disk,
// listening on 127.0.0.1 only, with random ports, DNS and gRPC disabled,
// and session_ttl_min lowered to ConsulSessionTTLMin. Its methods are safe
// for concurrent use.
type Consul struct {
	bin     string
	cmd     *exec.Cmd
	addr    string // host:port of the HTTP or, with TLS, the HTTPS API
	tls     bool
	token   string
	caFile  string
	cert    string
	key     string
	log     *SyncBuffer
	persist bool
	exited  chan struct{} // closed when the agent has exited
	waitErr error         // the agent's exit status; read after exited
	once    sync.Once
}

// NewConsul starts an agent keeping its files in dir, for callers without a
// testing.TB (see SharedConsul). It returns once the HTTP API answers and a
// raft leader is elected, the agent's node is registered (sessions need
// it), and, with ACLs, the management token works. The
// caller must Close it. The binary comes from ConsulTool, built on first
// use; an error wrapping *ToolError means it could not be had.
func NewConsul(dir string, opts ConsulOptions) (*Consul, error) {
	bin, err := ConsulTool.Binary()
	if err != nil {
		return nil, &ToolError{Tool: ConsulTool, Err: err}
	}
	if opts.Persist {
		st, err := loadConsulState(dir)
		if err != nil {
			return nil, err
		}
		if st != nil {
			// A restart: the ports are the data's, and no others will do.
			if err := st.checkFree(dir); err != nil {
				return nil, err
			}
			return startConsul(bin, dir, opts, st)
		}
	}
	// A port found free may be taken before the agent binds it (the serf
	// ports are UDP too, which freeTCPPorts does not probe); that shows as
	// an early exit, and other ports will do.
	var lastErr error
	for range 3 {
		c, err := startConsul(bin, dir, opts, nil)
		if err == nil {
			return c, nil
		}
		lastErr = err
		var exit *consulExitError
		if !errors.As(err, &exit) || !strings.Contains(exit.log, "address already in use") {
			break
		}
	}
	return nil, lastErr
}

type consulExitError struct {
	err error
	log string
}

func (e *consulExitError) Error() string {
	return fmt.Sprintf("consul exited during start-up (%v); its log:\n%s", e.err, e.log)
}

// Addr returns the API's address, "127.0.0.1:PORT": HTTP, or HTTPS for an
// agent started with TLS.
func (c *Consul) Addr() string { return c.addr }

// URL returns the API's base URL, "http://127.0.0.1:PORT" or
// "https://127.0.0.1:PORT".
func (c *Consul) URL() string {
	if c.tls {
		return "https://" + c.addr
	}
	return "http://" + c.addr
}

// Binary returns the path of the consul binary the agent runs, for tests
// that run its CLI (`consul lock`, `consul kv`) against it.
func (c *Consul) Binary() string { return c.bin }

// ManagementToken returns the ACL bootstrap token, or "" without ACLs.
func (c *Consul) ManagementToken() string { return c.token }

// TLSFiles returns the client's CA, certificate and key files, or empty
// strings without TLS.
func (c *Consul) TLSFiles() (caFile, certFile, keyFile string) { return c.caFile, c.cert, c.key }

// Log returns what the agent has logged so far (warnings and errors).
func (c *Consul) Log() string { return c.log.String() }

// Close stops the agent and waits for it to exit: a -dev agent, whose
// data dies with it anyway, is killed; a Persist server gets SIGTERM and
// shuts down cleanly (without leaving its cluster), and is killed only if
// it has not exited within 30 s. Calling Close or Kill again is harmless.
func (c *Consul) Close() {
	c.once.Do(func() {
		if !c.persist {
			c.kill()
			return
		}
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(consulStopTimeout):
			c.kill()
		}
	})
}

// Kill kills the agent with SIGKILL, as a crash would, and waits for it to
// exit. A Persist server loses nothing it acknowledged: raft writes each
// entry to its log, with fsync, before it answers, and a restart on the same
// dir replays the log (TestConsulPersistSurvivesKill). Calling Close or
// Kill again is harmless.
func (c *Consul) Kill() { c.once.Do(c.kill) }

func (c *Consul) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// StartConsul starts an agent in a fresh t.TempDir and stops it when the
// test ends; the agent's log is shown if the test fails. A consul binary
// that cannot be built goes through Unavailable (skip, or fail under
// BATON_REQUIRE_SERVERS=1); an agent that fails to start fails the test.
func StartConsul(t testing.TB, opts ConsulOptions) *Consul {
	t.Helper()
	c, err := NewConsul(t.TempDir(), opts)
	var te *ToolError
	if errors.As(err, &te) {
		Unavailable(t, "consul", fmt.Errorf("%w\n%s", te.Err, ConsulTool.Hint()))
	}
	if err != nil {
		t.Fatalf("start consul: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() && c.log.Len() > 0 {
			t.Logf("consul log:\n%s", c.log)
		}
	})
	t.Cleanup(c.Close)
	return c
}

var sharedConsul sharedServer[*Consul]

// SharedConsul returns a plain agent shared by every test of the test
// binary, starting it on first use, so that a package pays for one agent;
// tests that keep to key prefixes of their own do not disturb each other.
// A test package that uses it must call StopSharedConsul from TestMain
// after m.Run. A missing binary goes through Unavailable, as for
// StartConsul.
func SharedConsul(t testing.TB) *Consul {
	t.Helper()
	return sharedConsul.get(t, "consul",
		func(dir string) (*Consul, error) { return NewConsul(dir, ConsulOptions{}) },
		func(err error) error {
			var te *ToolError
			if errors.As(err, &te) {
				return fmt.Errorf("%w\n%s", te.Err, ConsulTool.Hint())
			}
			return nil
		})
}

// StopSharedConsul stops the agent SharedConsul started, if any, and
// removes its directory.
func StopSharedConsul() { sharedConsul.stop() }
