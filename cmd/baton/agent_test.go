package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/testkit"
)

// freePort returns a free loopback address that no other test in this
// process was given.
func freePort(t *testing.T) string {
	t.Helper()
	return testkit.FreeAddr(t, "127.0.0.1")
}

// A single-member group run by `baton agent`, with material from `baton
// tls`; `baton run`, `leader` and `is-leader` go through agent://.
// startAgent makes group material with `baton tls` in dir and starts a
// one-member group run by `baton agent` on loopback, with env added to the
// agent's environment; it returns once the agent serves, with its HTTP
// address.
func startAgent(t *testing.T, dir string, env ...string) (*batonProc, string) {
	t.Helper()
	agent, httpAddr, _ := startAgentBind(t, dir, env...)
	return agent, httpAddr
}

// startAgentBind is startAgent, also returning the member's group address
// (for raft:// members to join). The token file the agent writes by
// default is removed when the test ends, even if the agent was killed.
func startAgentBind(t *testing.T, dir string, env ...string) (*batonProc, string, string) {
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
	sock := agentSocketOf(t, httpAddr)
	t.Cleanup(func() { _ = os.Remove(sock); _ = os.Remove(agentTokenFileOf(sock)) })
	testkit.Eventually(t, 30*time.Second, "the agent serving", func() bool { return agentServing(httpAddr) })
	return agent, httpAddr, bind
}

// agentSocketOf returns the default socket of the agent whose HTTP
// address is httpAddr.
func agentSocketOf(t testing.TB, httpAddr string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(httpAddr)
	sock, err := defaultAgentSocket(os.LookupEnv, host, port)
	if err != nil {
		t.Fatal(err)
	}
	return sock
}

// viaSocket is the URL that agentCall and agentPost send to path on the
// agent's Unix socket sock, as curl --unix-socket SOCK http://agent/PATH.
func viaSocket(sock, path string) string { return "unix:" + sock + "|http://agent" + path }

// httpFor returns the client and URL of url, which viaSocket may have made.
func httpFor(url string) (*http.Client, string) {
	sock, u, ok := strings.Cut(strings.TrimPrefix(url, "unix:"), "|")
	if !strings.HasPrefix(url, "unix:") || !ok {
		return http.DefaultClient, url
	}
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}, u
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
	testkit.Eventually(t, 30*time.Second, "worker-1 leading", func() bool {
		r := runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "ag", "--id", "worker-1")
		return r.code == 0
	})
	r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "ag", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"holder":"worker-1"`) {
		t.Fatalf("leader --json: %d %q %s", r.code, r.stdout, r.stderr)
	}
	// A client reading many leases at once (package balance does) over the
	// agent's TCP address, with no credential: the read call is open there.
	reads, err := raft.Dial(httpAddr, raft.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := raft.New(reads, raft.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.Close(context.Background()) })
	recs, errs := rb.Leaders(testkit.Context(t, 30*time.Second), []string{"ag", "nobody-holds-this"})
	if errs[0] != nil || recs[0].Holder != "worker-1" || !errors.Is(errs[1], baton.ErrNoLeader) {
		t.Errorf("Leaders over the agent's TCP address: %+v, %v; want worker-1, then nobody", recs, errs)
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
// agentServing reports whether the agent at httpAddr answers its lease
// table, which it serves once its member is in the group.
func agentServing(httpAddr string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + httpAddr + "/v1/leases")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func agentCall(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	hc, url := httpFor(url)
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
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
	testkit.Eventually(t, 30*time.Second, "health 200 for worker-1's lease", func() bool {
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
			Token    uint64 `json:"token,string"`
			HeldHere bool   `json:"held_here"`
		} `json:"leases"`
	}
	if err := json.Unmarshal([]byte(body), &leases); err != nil || code != http.StatusOK {
		t.Fatalf("GET /v1/leases: %d %s (%v)", code, body, err)
	}
	if len(leases.Leases) != 1 || leases.Leases[0].Name != "web" || leases.Leases[0].Holder != "worker-1" || !leases.Leases[0].HeldHere {
		t.Errorf("GET /v1/leases = %s, want web held here by worker-1", body)
	}
	testkit.Eventually(t, 30*time.Second, "metrics with worker-1's renewals", func() bool {
		code, body := agentCall(t, "GET", base+"/metrics", "")
		return code == http.StatusOK && strings.Contains(body, `baton_is_leader{lease="web"} 1`) &&
			strings.Contains(body, "baton_renew_latency_seconds_count") && !strings.Contains(body, "baton_renew_latency_seconds_count 0")
	})
	if code, body := agentCall(t, "GET", base+"/", ""); code != http.StatusOK || !strings.Contains(body, `data-lease="web"`) {
		t.Errorf("GET /: %d, want the status page with web's term", code)
	}
	// Over TCP, nothing that takes the token: the refusal names the socket.
	sock := agentSocketOf(t, httpAddr)
	for _, c := range []struct{ method, path, token string }{
		{"GET", "/v1/status", ""}, {"GET", "/v1/status", token}, {"POST", "/v1/leases/web/resign", token},
		{"GET", "/v1/leases", token}, {"POST", "/v1/raft/client/renew", ""}, {"POST", "/v1/raft/read", token},
	} {
		if code, body := agentCall(t, c.method, base+c.path, c.token); code != http.StatusForbidden || !strings.Contains(body, "--unix-socket "+sock) {
			t.Errorf("%s %s over TCP (token %t): %d %s, want 403 naming the socket", c.method, c.path, c.token != "", code, body)
		}
	}
	// The reads of agent:// clients are open over TCP: a held poll without
	// a body is refused for its body, not for the transport.
	if code, body := agentCall(t, "POST", base+"/v1/raft/held", ""); code != http.StatusBadRequest {
		t.Errorf("POST /v1/raft/held over TCP without a body: %d %s, want 400 for the body", code, body)
	}
	// On the socket, what needs the token still does.
	if code, _ := agentCall(t, "GET", viaSocket(sock, "/v1/status"), ""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/status without the token: %d, want 401", code)
	}
	if code, body := agentCall(t, "GET", viaSocket(sock, "/v1/status"), token); code != http.StatusOK {
		t.Errorf("GET /v1/status with the token on the socket: %d %s, want 200", code, body)
	}
	if code, body := agentCall(t, "POST", viaSocket(sock, "/v1/leases/web/resign"), ""); code != http.StatusUnauthorized {
		t.Errorf("resign without the token: %d %s, want 401", code, body)
	}
	if code, body := agentCall(t, "POST", viaSocket(sock, "/v1/leases/web/resign"), "not-"+token); code != http.StatusUnauthorized {
		t.Errorf("resign with a wrong token: %d %s, want 401", code, body)
	}
	code, body = agentCall(t, "POST", viaSocket(sock, "/v1/leases/web/resign?wait=30s"), token)
	if code != http.StatusOK || !strings.Contains(body, `"reason": "resign-requested"`) {
		t.Errorf("resign with the token: %d %s, want 200 released", code, body)
	}
	// worker-1, the only candidate, campaigns again and leads again.
	testkit.Eventually(t, 30*time.Second, "worker-1 leading again", func() bool {
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
		{"no secret", nil, []string{"run", "--backend", "raft://", "--lease", "x", "--", "true"},
			[]string{"join secret is required", "BATON_SECRET", "--secret-from"}},
		{"short secret", []string{"BATON_SECRET=short"}, []string{"run", "--backend", "raft://", "--lease", "x", "--", "true"},
			[]string{"BATON_SECRET", "is 5 bytes", "at least 16"}},
		{"part of CA mode", []string{"BATON_SECRET=0123456789abcdef"}, []string{"run", "--backend", "raft://", "--lease", "x",
			"--tls-ca", missing, "--", "true"},
			[]string{"--tls-cert is missing", "--tls-key is missing", "give none of them for the secret-only mode"}},
		{"two secrets", []string{"BATON_SECRET=0123456789abcdef"}, []string{"agent", "--secret-file", missing},
			[]string{"give the join secret once", "BATON_SECRET and --secret-file"}},
		{"unknown secret source", nil, []string{"agent", "--secret-from", "vault:x"},
			[]string{`--secret-from "vault:x"`, "ssm:PARAMETER"}},
		{"missing secret file", nil, []string{"agent", "--bind", "127.0.0.1:0", "--secret-file", missing},
			[]string{"--secret-file", "nope.pem"}},
		{"missing TLS file", []string{"BATON_SECRET=0123456789abcdef"}, []string{"run", "--backend", "raft://", "--lease", "x",
			"--bind", "127.0.0.1:0", "--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing, "--", "true"},
			[]string{"nope.pem"}},
		{"bad join", []string{"BATON_SECRET=0123456789abcdef"}, []string{"agent", "--join", "consul:x",
			"--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing},
			[]string{"--join", "static:"}},
		{"is-leader cannot be a member", nil, []string{"is-leader", "--backend", "raft://", "--lease", "x"},
			[]string{"agent://"}},
		{"agent on a public address with a token", []string{"BATON_SECRET=0123456789abcdef"}, []string{"agent", "--http", "0.0.0.0:8790", "--http-token", "tok",
			"--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing},
			[]string{"--http-token with --http 0.0.0.0:8790", "only on its Unix socket", "cleartext"}},
		{"agent with a token in BATON_HTTP_TOKEN on a public address", []string{"BATON_SECRET=0123456789abcdef", "BATON_HTTP_TOKEN=tok"}, []string{"agent", "--http", "[::]:8790",
			"--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing},
			[]string{"BATON_HTTP_TOKEN with --http [::]:8790"}},
		{"run through an agent of another host", nil, []string{"run", "--backend", "agent://192.0.2.1:8790", "--lease", "x", "--", "true"},
			[]string{"192.0.2.1:8790 is reached over TCP", "Unix socket"}},
		{"a token for an agent of another host", nil, []string{"is-leader", "--backend", "agent://tok@192.0.2.1:8790", "--lease", "x"},
			[]string{"cleartext"}},
		{"agent with a relative socket", []string{"BATON_SECRET=0123456789abcdef"}, []string{"agent", "--socket", "agent.sock",
			"--tls-ca", missing, "--tls-cert", missing, "--tls-key", missing},
			[]string{"--socket \"agent.sock\": want an absolute path"}},
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

// The heartbeat child of the resign tests: the test binary, run by `baton
// run` with beatFileEnv set. It appends "start TOKEN PID UNIXNANO OTHERS
// HOLDER" (OTHERS: children that started before it and still run), then
// "beat TOKEN PID UNIXNANO" every 20 ms. On SIGTERM it appends "term ..."
// and, with beatIgnoreTermEnv=1, goes on beating until SIGKILL; otherwise
// it appends "stop ..." and exits.
const (
	beatFileEnv       = "BATON_TEST_BEAT_FILE"
	beatIgnoreTermEnv = "BATON_TEST_BEAT_IGNORE_TERM"
)

func init() {
	if file := os.Getenv(beatFileEnv); file != "" {
		os.Exit(beatMain(file, os.Getenv(beatIgnoreTermEnv) == "1"))
	}
}

func beatMain(file string, ignoreTerm bool) int {
	token, holder := os.Getenv("BATON_TOKEN"), os.Getenv("BATON_HOLDER")
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	others := 0
	for _, ev := range starts(readEvents(file)) {
		if ev.pid != os.Getpid() && isOurChild(ev.pid) {
			others++
		}
	}
	line := func(kind string) string {
		return fmt.Sprintf("%s %s %d %d", kind, token, os.Getpid(), time.Now().UnixNano())
	}
	appendLine(file, fmt.Sprintf("%s %d %s", line("start"), others, holder))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			appendLine(file, line("beat"))
		case <-term:
			appendLine(file, line("term"))
			if !ignoreTerm {
				appendLine(file, line("stop"))
				return 0
			}
		}
	}
}

// lastBeat returns the time of pid's last line in evs.
func lastBeat(evs []event, pid int) int64 {
	var last int64
	for _, e := range evs {
		if e.pid == pid && e.at > last {
			last = e.at
		}
	}
	return last
}

// A resign requested through the agent's API hands the lease over only
// after the holder's command has stopped: also when the command ignores
// SIGTERM (it runs on until SIGKILL, --grace later), and also when the
// holder is a raft:// member rather than an agent:// client. The next
// holder's command starts with no earlier command alive, after the last
// heartbeat of its predecessor.
func TestAgentResignWaitsForTheWork(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		raftHolder bool
		ignoreTerm bool
	}{
		{"agent-client/ignores-SIGTERM", false, true},
		{"agent-client/stops-on-SIGTERM", false, false},
		{"raft-member/ignores-SIGTERM", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testAgentResignWaitsForTheWork(t, tc.raftHolder, tc.ignoreTerm)
		})
	}
}

func testAgentResignWaitsForTheWork(t *testing.T, raftHolder, ignoreTerm bool) {
	const token, lease, secret = "resign-test-token", "resign-job", "agent-test-secret-0123456789"
	dir := t.TempDir()
	_, httpAddr, bind := startAgentBind(t, dir, "BATON_HTTP_TOKEN="+token)
	base := "http://" + httpAddr
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ignore := "0"
	if ignoreTerm {
		ignore = "1"
	}
	env := testEnv("BATON_HTTP_TOKEN="+token, "BATON_SECRET="+secret, beatFileEnv+"="+file, beatIgnoreTermEnv+"="+ignore)
	// --grace 1s: a command that ignores SIGTERM runs a second after it.
	run := []string{"run", "--lease", lease, "--ttl", "3s", "--grace", "1s", "--log-level", "debug"}
	holderArgs := append(slices.Clone(run), "--id", "holder", "--backend", "agent://"+httpAddr, "--", self)
	if raftHolder {
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", "m2", "--host", "127.0.0.1"); r.code != 0 {
			t.Fatalf("tls cert: %d %s", r.code, r.stderr)
		}
		holderArgs = append(slices.Clone(run), "--id", "holder", "--backend", "raft://",
			"--bind", freePort(t), "--join", "static:"+bind, "--bootstrap-expect", "0", "--voters", "1",
			"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "m2.pem"), "--tls-key", filepath.Join(dir, "m2-key.pem"),
			"--", self)
	}
	startBaton(t, "holder", env, holderArgs...)
	testkit.Eventually(t, 60*time.Second, "the holder's command to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	if first.holder != "holder" {
		t.Fatalf("first command started for %q, want holder", first.holder)
	}
	startBaton(t, "standby", env, append(slices.Clone(run), "--id", "standby", "--backend", "agent://"+httpAddr, "--", self)...)
	testkit.Eventually(t, 30*time.Second, "the standby queued", func() bool {
		code, body := agentCall(t, "GET", base+"/v1/leases/"+lease, "")
		return code == http.StatusOK && strings.Contains(body, `"waiters": 1`)
	})

	if code, body := agentCall(t, "POST", viaSocket(agentSocketOf(t, httpAddr), "/v1/leases/"+lease+"/resign?wait=0"), token); code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("resign: %d %s", code, body)
	}
	testkit.Eventually(t, 60*time.Second, "the standby's command to start", func() bool { return len(starts(readEvents(file))) >= 2 })
	testkit.Eventually(t, 30*time.Second, "the holder's command gone", func() bool { return !alive(first.pid) })
	evs := readEvents(file)
	second := starts(evs)[1]
	if second.holder != "standby" || second.token <= first.token {
		t.Fatalf("second command: holder %q token %d, want standby above %d", second.holder, second.token, first.token)
	}
	if second.others != 0 {
		t.Errorf("the standby's command started while %d earlier command(s) still ran", second.others)
	}
	if last := lastBeat(evs, first.pid); last >= second.at {
		t.Errorf("the holder's command was still beating %s after the standby's started",
			time.Duration(last-second.at))
	}
	if !slices.ContainsFunc(evs, func(e event) bool { return e.kind == "term" && e.pid == first.pid }) {
		t.Error("the holder's command never got SIGTERM")
	}
}

// agentPost posts body to the agent, with the bearer token when not empty.
func agentPost(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	hc, url := httpFor(url)
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Another local process — one that read the holder's session ID from the
// agent's open lease read — cannot expire, destroy, release or renew the
// holder's session through any route of an agent started without
// --http-token: not with a raw log command on the member route, not without the agent's
// token, and not with the token but without the session's own secret. The
// agent makes a token at start, in a file only its user can read, where
// `baton run --backend agent://` finds it.
func TestAgentClientsActOnlyOnTheirOwnSessions(t *testing.T) {
	t.Parallel()
	agent, httpAddr := startAgent(t, t.TempDir())
	base := "http://" + httpAddr
	sock := agentSocketOf(t, httpAddr)
	tokenFile := agentTokenFileOf(sock)
	st, err := os.Stat(tokenFile)
	if err != nil {
		t.Fatalf("the agent wrote no token file: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %s, want 0600", st.Mode().Perm())
	}
	token, err := readAgentToken(tokenFile)
	if err != nil || len(token) < 32 {
		t.Fatalf("token file: %q %v", token, err)
	}

	const lease = "owned"
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// No token in its environment: it reads the agent's token file.
	startBaton(t, "holder", testEnv(beatFileEnv+"="+file), "run", "--backend", "agent://"+httpAddr,
		"--lease", lease, "--id", "holder", "--ttl", "3s", "--", self)
	testkit.Eventually(t, 30*time.Second, "the holder's command to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	child := starts(readEvents(file))[0]

	var view struct {
		Session     string `json:"session"`
		Token       uint64 `json:"token"`
		SessionGone bool   `json:"session_gone"`
	}
	code, body := agentCall(t, "GET", base+"/v1/raft/lease?name="+lease, "")
	if err := json.Unmarshal([]byte(body), &view); err != nil || code != http.StatusOK || view.Session == "" || view.Token != child.token {
		t.Fatalf("open read of the lease: %d %s (%v), want the holder's session and token %d", code, body, err, child.token)
	}
	sid := view.Session
	guess := strings.Repeat("0", 64)
	for _, a := range []struct {
		what, path, token, body string
		want                    int
	}{
		{"raw session-expire, no credentials", "/v1/raft/apply", "", `{"op":"session-expire","session":"` + sid + `"}`, http.StatusNotFound},
		{"raw session-expire with the token", "/v1/raft/apply", token, `{"op":"session-expire","session":"` + sid + `"}`, http.StatusNotFound},
		{"raw renew with the token", "/v1/raft/renew", token, `{"session":"` + sid + `"}`, http.StatusNotFound},
		{"destroy without the token", "/v1/raft/client/apply", "", `{"op":"session-destroy","session":"` + sid + `","secret":"` + guess + `"}`, http.StatusUnauthorized},
		{"destroy with the token, a stolen ID, no secret", "/v1/raft/client/apply", token, `{"op":"session-destroy","session":"` + sid + `"}`, http.StatusForbidden},
		{"destroy with the token and a guessed secret", "/v1/raft/client/apply", token, `{"op":"session-destroy","session":"` + sid + `","secret":"` + guess + `"}`, http.StatusForbidden},
		{"release with the token and a guessed secret", "/v1/raft/client/apply", token, fmt.Sprintf(`{"op":"release","session":%q,"secret":%q,"lease":%q,"token":%d}`, sid, guess, lease, view.Token), http.StatusForbidden},
		{"session-expire through the client API", "/v1/raft/client/apply", token, `{"op":"session-expire","session":"` + sid + `","secret":"` + guess + `"}`, http.StatusForbidden},
		{"renew without the token", "/v1/raft/client/renew", "", `{"session":"` + sid + `"}`, http.StatusUnauthorized},
		{"renew with a guessed secret", "/v1/raft/client/renew", token, `{"session":"` + sid + `","secret":"` + guess + `"}`, http.StatusForbidden},
		{"resign without the token", "/v1/leases/" + lease + "/resign?wait=0", "", ``, http.StatusUnauthorized},
	} {
		if code, body := agentPost(t, viaSocket(sock, a.path), a.token, a.body); code != a.want {
			t.Errorf("%s: %d %s, want %d", a.what, code, body, a.want)
		}
	}
	if code, _ := agentCall(t, "GET", viaSocket(sock, "/v1/status"), ""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/status without the token: %d, want 401", code)
	}

	code, body = agentCall(t, "GET", base+"/v1/raft/lease?name="+lease+"&session="+sid, "")
	if err := json.Unmarshal([]byte(body), &view); err != nil || code != http.StatusOK {
		t.Fatalf("read after the attacks: %d %s (%v)", code, body, err)
	}
	if view.SessionGone || view.Session != sid || view.Token != child.token {
		t.Fatalf("after the attacks the lease is %s; want the holder's session %s with token %d", body, sid, child.token)
	}
	if evs := readEvents(file); slices.ContainsFunc(evs, func(e event) bool { return e.kind == "term" }) || !alive(child.pid) {
		t.Fatal("the holder's command was stopped by the attacks")
	}
	for _, path := range []string{"/v1/leases", "/v1/raft/lease?name=" + lease, "/v1/health/leader", "/metrics", "/"} {
		if _, body := agentCall(t, "GET", base+path, ""); strings.Contains(body, token) {
			t.Errorf("GET %s shows the agent's token", path)
		}
	}

	_ = agent.cmd.Process.Signal(syscall.SIGTERM)
	if code := agent.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("agent exited %d after SIGTERM", code)
	}
	if _, err := os.Stat(tokenFile); !os.IsNotExist(err) {
		t.Errorf("the token file outlived the agent: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket outlived the agent: %v", err)
	}
}

// An agent that restarts writes a new token to its token file; its
// agent:// clients read the file again when the old token is refused, and
// lead again through the new agent instead of being refused for ever.
func TestAgentClientFollowsNewToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	agent, httpAddr, bind := startAgentBind(t, dir)
	backend := "agent://" + httpAddr
	leads := func() bool {
		return runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "tok", "--id", "worker-1").code == 0
	}
	startBaton(t, "run", testEnv(), "run", "--backend", backend, "--lease", "tok", "--id", "worker-1", "--ttl", "3s", "--", "sleep", "600")
	testkit.Eventually(t, 30*time.Second, "worker-1 leading", leads)
	file := agentTokenFileOf(agentSocketOf(t, httpAddr))
	old, err := readAgentToken(file)
	if err != nil {
		t.Fatal(err)
	}

	_ = agent.cmd.Process.Signal(syscall.SIGTERM)
	if code := agent.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("agent exited %d after SIGTERM", code)
	}
	startBaton(t, "agent-again", testEnv("BATON_SECRET=agent-test-secret-0123456789"), "agent",
		"--bind", bind, "--join", "static:"+bind, "--bootstrap-expect", "1", "--voters", "1",
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "a1.pem"), "--tls-key", filepath.Join(dir, "a1-key.pem"),
		"--http", httpAddr)
	testkit.Eventually(t, 30*time.Second, "the new agent serving", func() bool { return agentServing(httpAddr) })
	if tok, err := readAgentToken(file); err != nil || tok == old {
		t.Fatalf("the restarted agent's token file: %v; want a new token", err)
	}
	testkit.Eventually(t, 60*time.Second, "worker-1 leading through the restarted agent", leads)
}
