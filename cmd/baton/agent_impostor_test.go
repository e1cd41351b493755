package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// The impostor of the agent tests: the test binary, run with impostorEnv
// set to an address (HOST:PORT). It tries to bind the address every
// millisecond (Go sets SO_REUSEADDR on its listeners, as any user may),
// prints "bound" once it holds it, and then answers every request with
// 200 {"ttl": 36000000000000} (ten hours), printing each request it
// received as one JSON line: what a local user who takes a crashed agent's
// port learns, and what it tells the agent's clients.
const impostorEnv = "BATON_TEST_IMPOSTOR_ADDR"

func init() {
	if addr := os.Getenv(impostorEnv); addr != "" {
		os.Exit(impostorMain(addr))
	}
}

// impostorRequest is one request the impostor received.
type impostorRequest struct {
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Header http.Header `json:"header"`
	Body   string      `json:"body"`
}

func impostorMain(addr string) int {
	var ln net.Listener
	for {
		var err error
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var mu sync.Mutex
	fmt.Println("bound")
	err := http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		line, _ := json.Marshal(impostorRequest{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header, Body: string(body)})
		mu.Lock()
		fmt.Println(string(line))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ttl": 36000000000000}`)
	}))
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// startImpostor runs the impostor on addr as another, unprivileged user
// (nobody when the test is root; the test's own user otherwise, which must
// not get credentials either). bound is closed once it holds the address;
// requests returns what it received so far.
func startImpostor(t *testing.T, addr string) (bound <-chan struct{}, requests func() []impostorRequest) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	testkit.ShareWith(t, self)
	cmd := exec.Command(self)
	cmd.Env = append(testEnv(), impostorEnv+"="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: testkit.Unprivileged(t), Pdeathsig: syscall.SIGKILL}
	r := startReporter[impostorRequest](t, "impostor", cmd, "bound")
	return r.ready, r.Records
}

// An unprivileged local user who takes a crashed agent's TCP port gets no
// credential from the agent's clients, and cannot keep a stale leader
// leading. Three agents form a group; c1 leads through A1 (agent:// at
// A1's address, TTL 3 s), c2 waits through A2. Another user's process
// retries binding A1's port; A1 is killed -9 and the impostor takes the
// port, answering every call with a ten-hour TTL. The impostor receives
// neither a bearer token nor a session secret; c1's command stops by c1's
// own safe-until (the last renewal sent before the kill + 3 s); c2's
// command starts only after c1's last heartbeat. The agents run in CA
// mode and in the secret-only mode (no --tls-* flags).
func TestAgentImpostorGetsNoCredentials(t *testing.T) {
	t.Parallel()
	for _, caMode := range []bool{true, false} {
		name := "secret-only"
		if caMode {
			name = "CA"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testAgentImpostorGetsNoCredentials(t, caMode)
		})
	}
}

func testAgentImpostorGetsNoCredentials(t *testing.T, caMode bool) {
	const lease, secret = "impostor-job", "agent-test-secret-0123456789"
	dir := t.TempDir()
	if caMode {
		if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
			t.Fatalf("tls ca: %d %s", r.code, r.stderr)
		}
	}
	var binds, https, tokens []string
	for i := range 3 {
		name := fmt.Sprintf("a%d", i+1)
		if caMode {
			if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name, "--host", "127.0.0.1"); r.code != 0 {
				t.Fatalf("tls cert: %d %s", r.code, r.stderr)
			}
		}
		binds, https = append(binds, freePort(t)), append(https, freePort(t))
		tokens = append(tokens, fmt.Sprintf("impostor-test-token-%d-%d", i+1, time.Now().UnixNano()))
	}
	var agents []*batonProc
	for i := range 3 {
		name := fmt.Sprintf("a%d", i+1)
		args := []string{"agent", "--bind", binds[i], "--join", "static:" + strings.Join(binds, ","), "--bootstrap-expect", "3", "--voters", "3",
			"--http", https[i]}
		if caMode {
			args = append(args, "--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"))
		}
		agents = append(agents, startBaton(t, name, testEnv("BATON_SECRET="+secret, "BATON_HTTP_TOKEN="+tokens[i]), args...))
	}
	for _, h := range https {
		testkit.Eventually(t, 60*time.Second, "agent "+h+" serving", func() bool { return agentServing(h) })
	}

	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := []string{"run", "--lease", lease, "--ttl", "3s", "--grace", "200ms", "--log-level", "debug"}
	startBaton(t, "c1", testEnv("BATON_HTTP_TOKEN="+tokens[0], beatFileEnv+"="+file),
		append(slices.Clone(run), "--id", "c1", "--backend", "agent://"+https[0], "--", self)...)
	testkit.Eventually(t, 60*time.Second, "c1's command to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	if first.holder != "c1" {
		t.Fatalf("first command started for %q, want c1", first.holder)
	}
	startBaton(t, "c2", testEnv("BATON_HTTP_TOKEN="+tokens[1], beatFileEnv+"="+file),
		append(slices.Clone(run), "--id", "c2", "--backend", "agent://"+https[1], "--", self)...)
	testkit.Eventually(t, 30*time.Second, "c2 queued", func() bool {
		code, body := agentCall(t, "GET", "http://"+https[1]+"/v1/leases/"+lease, "")
		return code == http.StatusOK && strings.Contains(body, `"waiters": 1`)
	})

	bound, received := startImpostor(t, https[0])
	killed := time.Now()
	_ = agents[0].cmd.Process.Kill()
	select {
	case <-bound:
	case <-time.After(30 * time.Second):
		t.Fatal("the impostor never bound A1's port")
	}
	testkit.Eventually(t, 60*time.Second, "c2's command to start", func() bool { return len(starts(readEvents(file))) >= 2 })
	second := starts(readEvents(file))[1]
	if second.holder != "c2" {
		t.Fatalf("second command started for %q, want c2", second.holder)
	}
	// What the impostor learnt by the time c2 led: c1's renewals since
	// the kill, had c1 sent them over TCP.
	for _, r := range received() {
		if auth := r.Header.Get("Authorization"); auth != "" {
			t.Errorf("the impostor received an Authorization header on %s %s", r.Method, r.Path)
		}
		for _, tok := range tokens {
			if strings.Contains(r.Body, tok) || strings.Contains(r.Path, tok) {
				t.Errorf("the impostor received an agent's token on %s %s", r.Method, r.Path)
			}
		}
		if strings.Contains(r.Body, `"secret"`) {
			t.Errorf("the impostor received a session secret on %s %s: %s", r.Method, r.Path, r.Body)
		}
	}
	t.Logf("the impostor received %d requests", len(received()))
	testkit.Eventually(t, 30*time.Second, "c1's command gone (it must stop by its own safe-until, 3 s after the kill)", func() bool { return !alive(first.pid) })

	evs := readEvents(file)
	if last := lastBeat(evs, first.pid); last >= second.at {
		t.Errorf("c1's command was still beating %s after c2's started: two leaders at once", time.Duration(last-second.at))
	}
	if last, bound := lastBeat(evs, first.pid), killed.Add(3*time.Second).UnixNano(); last > bound {
		t.Errorf("c1's command beat %s past the kill of its agent + its own TTL: a reply stretched its safe-until", time.Duration(last-bound))
	}
}
