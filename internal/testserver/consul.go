package testserver

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/certs"
	"github.com/hashicorp/consul/api"
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
}

// Consul is a `consul agent -dev` (an in-memory single-server datacenter)
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
	// A port found free may be taken before the agent binds it (the serf
	// ports are UDP too, which freeTCPPorts does not probe); that shows as
	// an early exit, and other ports will do.
	var lastErr error
	for range 3 {
		c, err := startConsul(bin, dir, opts)
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

// ToolError reports that a tool's binary could not be built or found; tests
// hand it to Unavailable rather than failing outright.
type ToolError struct {
	Tool Tool
	Err  error
}

// Error implements error.
func (e *ToolError) Error() string { return fmt.Sprintf("%v\n%s", e.Err, e.Tool.Hint()) }

// Unwrap returns the underlying error.
func (e *ToolError) Unwrap() error { return e.Err }

type consulExitError struct {
	err error
	log string
}

func (e *consulExitError) Error() string {
	return fmt.Sprintf("consul exited during start-up (%v); its log:\n%s", e.err, e.log)
}

func startConsul(bin, dir string, opts ConsulOptions) (*Consul, error) {
	ports, err := freeTCPPorts(4)
	if err != nil {
		return nil, err
	}
	httpPort, serfLAN, serfWAN, server := ports[0], ports[1], ports[2], ports[3]
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	c := &Consul{
		bin:    bin,
		addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		tls:    opts.TLS,
		log:    new(SyncBuffer),
		exited: make(chan struct{}),
	}
	portCfg := fmt.Sprintf("http = %d\n\t\thttps = -1", httpPort)
	var extra []string
	if opts.TLS {
		portCfg = fmt.Sprintf("http = -1\n\t\thttps = %d", httpPort)
		tlsCfg, err := c.writeTLSMaterial(dir)
		if err != nil {
			return nil, err
		}
		extra = append(extra, tlsCfg)
	}
	if opts.ACL {
		var b [16]byte
		_, _ = rand.Read(b[:])
		c.token = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
		extra = append(extra, fmt.Sprintf(`acl {
	enabled = true
	default_policy = "deny"
	enable_token_persistence = false
	tokens {
		initial_management = %q
		agent = %q
	}
}`, c.token, c.token))
	}
	cfg := fmt.Sprintf(`ports {
		%s
		dns = -1
		grpc = -1
		grpc_tls = -1
		serf_lan = %d
		serf_wan = %d
		server = %d
}
session_ttl_min = %q
disable_update_check = true
connect { enabled = false }
peering { enabled = false }
ui_config { enabled = false }
log_level = "WARN"
%s
`, portCfg, serfLAN, serfWAN, server, ConsulSessionTTLMin.String(), strings.Join(extra, "\n"))
	cfgFile := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "agent", "-dev",
		"-bind=127.0.0.1", "-client=127.0.0.1",
		"-node="+consulNodeName,
		"-data-dir="+data,
		"-config-file="+cfgFile)
	cmd.Dir = dir
	cmd.Stdout = c.log
	cmd.Stderr = c.log
	// Should the test binary die without its clean-up (a panic, a timeout),
	// the kernel kills the agent rather than leaving it running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start consul: %w", err)
	}
	c.cmd = cmd
	go func() {
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	if err := c.awaitLeader(consulStartTimeout); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// writeTLSMaterial makes a CA, a server certificate for 127.0.0.1 and a
// client certificate, writes them into dir, and returns the agent's tls
// stanza.
func (c *Consul) writeTLSMaterial(dir string) (string, error) {
	ca, err := certs.NewCA("baton test consul CA", time.Hour)
	if err != nil {
		return "", err
	}
	srvCert, srvKey, err := ca.Issue("server.dc1.consul", []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		return "", err
	}
	cliCert, cliKey, err := ca.Issue("baton-client", nil, time.Hour)
	if err != nil {
		return "", err
	}
	c.caFile = filepath.Join(dir, "ca.pem")
	c.cert = filepath.Join(dir, "client.pem")
	c.key = filepath.Join(dir, "client-key.pem")
	srvCertFile, srvKeyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{c.caFile, ca.CertPEM(), 0o644},
		{srvCertFile, srvCert, 0o644},
		{srvKeyFile, srvKey, 0o600},
		{c.cert, cliCert, 0o644},
		{c.key, cliKey, 0o600},
	} {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf(`tls {
	https {
		ca_file = %q
		cert_file = %q
		key_file = %q
		verify_incoming = true
	}
}`, c.caFile, srvCertFile, srvKeyFile), nil
}

// consulNodeName is the test agent's node name.
const consulNodeName = "baton-test"

// awaitLeader polls the HTTP API until /v1/status/leader names a leader,
// with ACLs until the management token resolves, and until the agent's node
// is registered (sessions need it).
func (c *Consul) awaitLeader(timeout time.Duration) error {
	hc, err := c.httpClient()
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		last = c.probe(hc)
		if last == nil {
			return nil
		}
		select {
		case <-c.exited:
			return &consulExitError{err: c.waitErr, log: c.log.String()}
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consul not ready within %s: %v; its log:\n%s", timeout, last, c.log)
		}
	}
}

func (c *Consul) probe(hc *http.Client) error {
	get := func(path string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL()+path, nil)
		if err != nil {
			return "", err
		}
		if c.token != "" {
			req.Header.Set("X-Consul-Token", c.token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		var buf strings.Builder
		_, _ = io.Copy(&buf, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(buf.String()))
		}
		return strings.TrimSpace(buf.String()), nil
	}
	leader, err := get("/v1/status/leader")
	if err != nil {
		return err
	}
	if leader == "" || leader == `""` {
		return errors.New("no raft leader yet")
	}
	if c.token != "" {
		if _, err := get("/v1/acl/token/self"); err != nil {
			return err
		}
	}
	// Sessions are tied to the agent's node, and creating one fails with
	// "Missing node registration" until the agent's first anti-entropy sync
	// has put the node in the catalog, which comes a moment after the leader.
	node, err := get("/v1/catalog/node/" + consulNodeName)
	if err != nil {
		return err
	}
	if node == "" || node == "null" || !strings.Contains(node, `"Node"`) {
		return errors.New("the agent's node is not in the catalog yet")
	}
	return nil
}

// httpClient is a plain client for the agent's API: with TLS it trusts the
// test CA and presents the client certificate.
func (c *Consul) httpClient() (*http.Client, error) {
	tr := &http.Transport{}
	if c.tls {
		cfg, err := c.clientTLS()
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	}
	return &http.Client{Transport: tr}, nil
}

func (c *Consul) clientTLS() (*tls.Config, error) {
	caPEM, err := os.ReadFile(c.caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", c.caFile)
	}
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
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

// Close kills the agent and waits for it to exit. Calling it again is
// harmless.
func (c *Consul) Close() {
	c.once.Do(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
	})
}

// Client returns an API client for the agent at addr (the agent's
// Addr, or a Proxy's in front of it), with the management token when the
// agent has ACLs. Clients hold no resources that need closing.
func (c *Consul) Client(t testing.TB, addr string) *api.Client {
	t.Helper()
	cfg := &api.Config{Address: addr, Scheme: "http", Token: c.token}
	if c.tls {
		cfg.Scheme = "https"
		cfg.TLSConfig = api.TLSConfig{CAFile: c.caFile, CertFile: c.cert, KeyFile: c.key}
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		t.Fatalf("consul client for %s: %v", addr, err)
	}
	return client
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

// freeTCPPorts returns n distinct ports that were free on 127.0.0.1 a
// moment ago. All listeners stay open until all are found, so that the
// same port is not handed out twice.
func freeTCPPorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
