package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freePort returns a loopback address the kernel just handed out.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A single-member group run by `baton agent`, with material from `baton
// tls`; `baton run`, `leader` and `is-leader` go through agent://.
// startAgent makes group material with `baton tls` in dir and starts a
// one-member group run by `baton agent` on loopback, with env added to the
// agent's environment; it returns once the agent serves, with its HTTP
// address.
func startAgent(t *testing.T, dir string, env ...string) (*batonProc, string) {
	t.Helper()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", "a1", "--host", "127.0.0.1"); r.code != 0 {
		t.Fatalf("tls cert: %d %s", r.code, r.stderr)
	}
	bind, httpAddr := freePort(t), freePort(t)
	agent := startBaton(t, "agent", testEnv(append([]string{"BATON_SECRET=agent-test-secret-0123456789"}, env...)...), "agent",
		"--bind", bind, "--join", "static:"+bind, "--bootstrap-expect", "1", "--voters", "1",
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "a1.pem"), "--tls-key", filepath.Join(dir, "a1-key.pem"),
		"--http", httpAddr)
	eventually(t, 30*time.Second, "the agent serving", func() bool { return strings.Contains(agent.out.String(), "agent serving") })
	return agent, httpAddr
}

func TestAgentServesClients(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	agent, httpAddr := startAgent(t, dir)
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", dir); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("a second tls ca overwrote the CA, or did not say which file exists: %d %s", r.code, r.stderr)
	}

	backend := "agent://" + httpAddr
	job := startBaton(t, "run", testEnv(), "run", "--backend", backend, "--lease", "ag", "--id", "worker-1", "--", "sleep", "60")
	eventually(t, 30*time.Second, "worker-1 leading", func() bool {
		r := runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "ag", "--id", "worker-1")
		return r.code == 0
	})
	r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "ag", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"holder":"worker-1"`) {
		t.Fatalf("leader --json: %d %q %s", r.code, r.stdout, r.stderr)
	}
	_ = job.cmd.Process.Signal(syscall.SIGTERM)
	if code := job.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run exited %d after SIGTERM", code)
	}
	if r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "ag"); r.code != 1 {
		t.Fatalf("leader after the holder left: exit %d, want 1 (nobody leads); %s", r.code, r.stderr)
	}
	_ = agent.cmd.Process.Signal(syscall.SIGTERM)
	if code := agent.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("agent exited %d after SIGTERM", code)
	}
}

// agentCall calls the agent's HTTP API, with the token when not empty.
func agentCall(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The agent's public HTTP API, served by the real binary with a token: the
// read-only calls answer without it, resign needs it.
func TestAgentHTTPAPI(t *testing.T) {
	t.Parallel()
	const token = "agent-http-test-token"
	agent, httpAddr := startAgent(t, t.TempDir(), "BATON_HTTP_TOKEN="+token)
	base := "http://" + httpAddr

	job := startBaton(t, "run", testEnv("BATON_HTTP_TOKEN="+token), "run", "--backend", "agent://"+httpAddr,
		"--lease", "web", "--id", "worker-1", "--ttl", "3s", "--", "sleep", "60")
	eventually(t, 30*time.Second, "health 200 for worker-1's lease", func() bool {
		code, _ := agentCall(t, "GET", base+"/v1/health/leader?lease=web", "")
		return code == http.StatusOK
	})
	// The group's only lease: no ?lease needed.
	if code, body := agentCall(t, "GET", base+"/v1/health/leader", ""); code != http.StatusOK || !strings.Contains(body, `"leader"`) {
		t.Errorf("GET /v1/health/leader: %d %s, want 200 leader", code, body)
	}
	if code, body := agentCall(t, "GET", base+"/v1/health/leader?lease=nobody", ""); code != http.StatusServiceUnavailable {
		t.Errorf("health of a lease nobody holds: %d %s, want 503", code, body)
	}
	code, body := agentCall(t, "GET", base+"/v1/leases", "")
	var leases struct {
		Leases []struct {
			Name     string `json:"name"`
			Holder   string `json:"holder"`
			Token    uint64 `json:"token"`
			HeldHere bool   `json:"held_here"`
		} `json:"leases"`
	}
	if err := json.Unmarshal([]byte(body), &leases); err != nil || code != http.StatusOK {
		t.Fatalf("GET /v1/leases: %d %s (%v)", code, body, err)
	}
	if len(leases.Leases) != 1 || leases.Leases[0].Name != "web" || leases.Leases[0].Holder != "worker-1" || !leases.Leases[0].HeldHere {
		t.Errorf("GET /v1/leases = %s, want web held here by worker-1", body)
	}
	eventually(t, 30*time.Second, "metrics with worker-1's renewals", func() bool {
		code, body := agentCall(t, "GET", base+"/metrics", "")
		return code == http.StatusOK && strings.Contains(body, `baton_is_leader{lease="web"} 1`) &&
			strings.Contains(body, "baton_renew_latency_seconds_count") && !strings.Contains(body, "baton_renew_latency_seconds_count 0")
	})
	if code, body := agentCall(t, "GET", base+"/", ""); code != http.StatusOK || !strings.Contains(body, `data-lease="web"`) {
		t.Errorf("GET /: %d, want the status page with web's term", code)
	}
	// What needed the token before still does.
	if code, _ := agentCall(t, "GET", base+"/v1/status", ""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/status without the token: %d, want 401", code)
	}

	if code, body := agentCall(t, "POST", base+"/v1/leases/web/resign", ""); code != http.StatusUnauthorized {
		t.Errorf("resign without the token: %d %s, want 401", code, body)
	}
	if code, body := agentCall(t, "POST", base+"/v1/leases/web/resign", "not-"+token); code != http.StatusUnauthorized {
		t.Errorf("resign with a wrong token: %d %s, want 401", code, body)
	}
	code, body = agentCall(t, "POST", base+"/v1/leases/web/resign?wait=30s", token)
	if code != http.StatusOK || !strings.Contains(body, `"reason": "resign-requested"`) {
		t.Errorf("resign with the token: %d %s, want 200 released", code, body)
	}
	// worker-1, the only candidate, campaigns again and leads again.
	eventually(t, 30*time.Second, "worker-1 leading again", func() bool {
		code, _ := agentCall(t, "GET", base+"/v1/health/leader?lease=web", "")
		return code == http.StatusOK
	})

	_ = job.cmd.Process.Signal(syscall.SIGTERM)
	if code := job.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run exited %d after SIGTERM", code)
	}
	_ = agent.cmd.Process.Signal(syscall.SIGTERM)
	if code := agent.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("agent exited %d after SIGTERM", code)
	}
}

func TestRaftFlagErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.pem")
	cases := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"no TLS, no secret", nil, []string{"run", "--backend", "raft://", "--lease", "x", "--", "true"},
			[]string{"--tls-ca is required", "--tls-cert is required", "--tls-key is required", "BATON_SECRET"}},
		{"short secret", []string{"BATON_SECRET=short"}, []string{"run", "--backend", "raft://", "--lease", "x",
			"--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing, "--", "true"},
			[]string{"BATON_SECRET is 5 bytes"}},
		{"missing TLS file", []string{"BATON_SECRET=0123456789abcdef"}, []string{"run", "--backend", "raft://", "--lease", "x",
			"--bind", "127.0.0.1:0", "--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing, "--", "true"},
			[]string{"nope.pem"}},
		{"bad join", []string{"BATON_SECRET=0123456789abcdef"}, []string{"agent", "--join", "consul:x",
			"--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing},
			[]string{"--join", "static:"}},
		{"is-leader cannot be a member", nil, []string{"is-leader", "--backend", "raft://", "--lease", "x"},
			[]string{"agent://"}},
		{"agent on a public address without a token", []string{"BATON_SECRET=0123456789abcdef"}, []string{"agent", "--http", "0.0.0.0:8790",
			"--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing},
			[]string{"--http-token"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startBaton(t, c.name, testEnv(c.env...), c.args...)
			if code := p.wait(t, 30*time.Second); code != exitUsage {
				t.Fatalf("exit %d, want %d; output:\n%s", code, exitUsage, p.out)
			}
			for _, w := range c.want {
				if !strings.Contains(p.out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, p.out)
				}
			}
		})
	}
	_ = os.Remove(missing)
}
