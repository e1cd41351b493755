package testserver

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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

// consulStopTimeout bounds how long Close waits for a Persist server to
// shut down after SIGTERM before it kills it.
const consulStopTimeout = 30 * time.Second

// consulStateFile is the file, in the directory of a Persist server, that
// keeps what a restart must reuse: the ports and the ACL token.
const consulStateFile = "consul-state.json"

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

// consulState is what a Persist server's restart must reuse, kept in
// consulStateFile.
type consulState struct {
	HTTP    int    `json:"http"` // the HTTP, or with TLS the HTTPS, port
	SerfLAN int    `json:"serf_lan"`
	SerfWAN int    `json:"serf_wan"`
	Server  int    `json:"server"`
	Token   string `json:"token,omitempty"`
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

// startConsul starts an agent in dir: a Persist server restarting on the
// state st of its first start, or, with st nil, a fresh agent on new ports.
func startConsul(bin, dir string, opts ConsulOptions, st *consulState) (*Consul, error) {
	restart := st != nil
	if !restart {
		ports, err := freeTCPPorts(4)
		if err != nil {
			return nil, err
		}
		st = &consulState{HTTP: ports[0], SerfLAN: ports[1], SerfWAN: ports[2], Server: ports[3]}
	}
	data := filepath.Join(dir, "data")
	if opts.Persist && !restart {
		// No saved state means no server ever came up on this dir; what a
		// failed start left would remember ports that are not saved.
		if err := os.RemoveAll(data); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	c := &Consul{
		bin:     bin,
		addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(st.HTTP)),
		tls:     opts.TLS,
		persist: opts.Persist,
		log:     new(SyncBuffer),
		exited:  make(chan struct{}),
	}
	portCfg := fmt.Sprintf("http = %d\n\t\thttps = -1", st.HTTP)
	var extra []string
	if opts.TLS {
		portCfg = fmt.Sprintf("http = -1\n\t\thttps = %d", st.HTTP)
		tlsCfg, err := c.tlsMaterial(dir, opts.Persist && restart)
		if err != nil {
			return nil, err
		}
		extra = append(extra, tlsCfg)
	}
	if opts.ACL {
		c.token = st.Token
		if c.token == "" {
			var b [16]byte
			_, _ = rand.Read(b[:])
			c.token = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
			st.Token = c.token
		}
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
`, portCfg, st.SerfLAN, st.SerfWAN, st.Server, ConsulSessionTTLMin.String(), strings.Join(extra, "\n"))
	mode := []string{"-dev"}
	if opts.Persist {
		mode = []string{"-server", "-bootstrap-expect=1"}
		// The raft timings of -dev are not settable outside it; the
		// multiplier 1 is the fastest a server takes. A single server that
		// left its own cluster on shutdown could not elect itself again.
		cfg += `performance { raft_multiplier = 1 }
leave_on_terminate = false
skip_leave_on_interrupt = true
`
	}
	cfgFile := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append(append([]string{"agent"}, mode...),
		"-bind=127.0.0.1", "-client=127.0.0.1",
		"-node="+consulNodeName,
		"-data-dir="+data,
		"-config-file="+cfgFile)...)
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
		c.Kill()
		return nil, err
	}
	if opts.Persist && !restart {
		if err := saveConsulState(dir, st); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// loadConsulState returns the state a Persist server saved in dir, or nil
// if none did.
func loadConsulState(dir string) (*consulState, error) {
	path := filepath.Join(dir, consulStateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("consul: read the saved ports: %w", err)
	}
	var st consulState
	if err := json.Unmarshal(b, &st); err != nil || st.HTTP == 0 || st.SerfLAN == 0 || st.SerfWAN == 0 || st.Server == 0 {
		return nil, fmt.Errorf("consul: %s is damaged (%v): remove %s to start a fresh server there", path, err, dir)
	}
	return &st, nil
}

// saveConsulState saves st in dir, atomically, for restarts.
func saveConsulState(dir string, st *consulState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, consulStateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("consul: save the ports: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, consulStateFile)); err != nil {
		return fmt.Errorf("consul: save the ports: %w", err)
	}
	return nil
}

// checkFree returns an error naming the first of the saved ports that is
// taken on 127.0.0.1: TCP for all, UDP too for the serf ports.
func (st *consulState) checkFree(dir string) error {
	for _, p := range []struct {
		name   string
		port   int
		udpToo bool
	}{{"http", st.HTTP, false}, {"serf_lan", st.SerfLAN, true}, {"serf_wan", st.SerfWAN, true}, {"server", st.Server, false}} {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			if p.udpToo {
				var pc net.PacketConn
				pc, err = net.ListenPacket("udp", addr)
				if err == nil {
					pc.Close()
				}
			}
		}
		if err != nil {
			return fmt.Errorf("consul: the server in %s must restart on the ports its data remembers, "+
				"but its %s port %s is taken (%v): stop whatever holds it (another consul on the same dir?), "+
				"or start on a fresh dir", dir, p.name, addr, err)
		}
	}
	return nil
}

// tlsMaterial makes a CA, a server certificate for 127.0.0.1 and a client
// certificate, writes them into dir, and returns the agent's tls stanza.
// With reuse, the files a previous start wrote there are used instead, so
// that clients of a restarted server keep trusting it.
func (c *Consul) tlsMaterial(dir string, reuse bool) (string, error) {
	c.caFile = filepath.Join(dir, "ca.pem")
	c.cert = filepath.Join(dir, "client.pem")
	c.key = filepath.Join(dir, "client-key.pem")
	srvCertFile, srvKeyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	stanza := fmt.Sprintf(`tls {
	https {
		ca_file = %q
		cert_file = %q
		key_file = %q
		verify_incoming = true
	}
}`, c.caFile, srvCertFile, srvKeyFile)
	if reuse {
		for _, f := range []string{c.caFile, c.cert, c.key, srvCertFile, srvKeyFile} {
			if _, err := os.Stat(f); err != nil {
				return "", fmt.Errorf("consul: restart with TLS: %w", err)
			}
		}
		return stanza, nil
	}
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
	return stanza, nil
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
