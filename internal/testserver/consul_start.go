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
	"syscall"
	"time"
)

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
	if opts.HTTPMaxConnsPerClient != 0 {
		extra = append(extra, fmt.Sprintf("limits { http_max_conns_per_client = %d }", opts.HTTPMaxConnsPerClient))
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
