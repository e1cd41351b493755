package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// agentMetricNames are the metrics `baton agent` serves
// (internal/statusapi.Metrics): `baton run --http` serves the same names,
// and no other baton_ name.
var agentMetricNames = []string{
	"baton_is_leader", "baton_transitions_total", "baton_term_duration_seconds", "baton_campaign_wait_seconds",
	"baton_renew_latency_seconds", "baton_renew_errors_total", "baton_safe_until_margin_seconds", "baton_lease_table_up",
}

// httpGet is one answer of a --http server.
type httpGet struct {
	status int
	body   string
	ctype  string
	err    error
}

func getHTTP(method, addr, path string) httpGet {
	req, err := http.NewRequest(method, "http://"+addr+path, nil)
	if err != nil {
		return httpGet{err: err}
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return httpGet{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return httpGet{status: resp.StatusCode, body: string(b), ctype: resp.Header.Get("Content-Type"), err: err}
}

// health is an answer of GET /v1/health/leader.
type health struct {
	code   int
	Status string `json:"status"`
	Lease  string `json:"lease"`
	Holder string `json:"holder"`
	Token  uint64 `json:"token,string"`
	Reason string `json:"reason"`
}

func (h health) String() string {
	return fmt.Sprintf("%d %s holder=%q token=%d (%s)", h.code, h.Status, h.Holder, h.Token, h.Reason)
}

// healthOf asks addr's health check; code 0 when it did not answer.
func healthOf(addr string) health {
	r := getHTTP("GET", addr, "/v1/health/leader")
	if r.err != nil {
		return health{Reason: r.err.Error()}
	}
	h := health{code: r.status}
	if err := json.Unmarshal([]byte(r.body), &h); err != nil {
		h.Reason = fmt.Sprintf("not JSON (%v): %s", err, r.body)
	}
	return h
}

// waitHealth waits until addr's health check answers code, naming holder
// and token when they are given, and returns the answer.
func waitHealth(t *testing.T, name, addr string, code int, holder string, token uint64) health {
	t.Helper()
	var last health
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%s's health check to answer %d (holder %q, token %d)", name, code, holder, token), func() bool {
		last = healthOf(addr)
		return last.code == code && (holder == "" || last.Holder == holder) && (token == 0 || last.Token == token)
	})
	return last
}

// metricsOf fetches and parses addr's /metrics.
func metricsOf(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	r := getHTTP("GET", addr, "/metrics")
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", r.status, r.err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(r.body))
	if err != nil {
		t.Fatalf("GET /metrics is not the Prometheus text format: %v\n%s", err, r.body)
	}
	return mfs
}

// metricValue returns the value of the gauge or counter name with labels.
func metricValue(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// checkMetrics checks that addr's /metrics parses, holds only the agent's
// baton_ names, and says whether this process leads lease. A standby
// learns of a term from its watch of the backend, a moment after its
// health check (which asks the backend) names the holder: it waits for
// that.
func checkMetrics(t *testing.T, name, addr, lease string, leads bool) {
	t.Helper()
	var problems []string
	ok := testkit.Poll(10*time.Second, 50*time.Millisecond, func() bool {
		problems = metricsProblems(t, name, addr, lease, leads)
		return len(problems) == 0
	})
	if !ok {
		t.Errorf("%s", strings.Join(problems, "\n"))
	}
}

func metricsProblems(t *testing.T, name, addr, lease string, leads bool) []string {
	t.Helper()
	var problems []string
	mfs := metricsOf(t, addr)
	for n := range mfs {
		if strings.HasPrefix(n, "baton_") && !slices.Contains(agentMetricNames, n) {
			problems = append(problems, fmt.Sprintf("%s: /metrics has %s, which the agent does not serve", name, n))
		}
	}
	for _, n := range []string{"baton_is_leader", "baton_transitions_total", "baton_lease_table_up", "baton_renew_latency_seconds", "baton_renew_errors_total"} {
		if mfs[n] == nil {
			problems = append(problems, fmt.Sprintf("%s: /metrics lacks %s", name, n))
		}
	}
	want := 0.0
	if leads {
		want = 1
	}
	if v, ok := metricValue(mfs, "baton_is_leader", map[string]string{"lease": lease}); !ok || v != want {
		problems = append(problems, fmt.Sprintf("%s: baton_is_leader{lease=%q} = %v (present %v), want %v", name, lease, v, ok, want))
	}
	if v, ok := metricValue(mfs, "baton_lease_table_up", nil); !ok || v != 1 {
		problems = append(problems, fmt.Sprintf("%s: baton_lease_table_up = %v, want 1", name, v))
	}
	if v, ok := metricValue(mfs, "baton_transitions_total", map[string]string{"lease": lease, "kind": "elected"}); !ok || v < 1 {
		problems = append(problems, fmt.Sprintf("%s: baton_transitions_total{kind=elected} = %v, want at least 1", name, v))
	}
	if _, ok := metricValue(mfs, "baton_safe_until_margin_seconds", map[string]string{"lease": lease}); ok != leads {
		problems = append(problems, fmt.Sprintf("%s: baton_safe_until_margin_seconds present %v, want %v (only a leader has a safe-until)", name, ok, leads))
	}
	return problems
}

// checkReadOnly checks that addr serves the status page and the lease,
// and no route that changes something or needs a token.
func checkReadOnly(t *testing.T, addr, lease, holder string) {
	t.Helper()
	page := getHTTP("GET", addr, "/")
	if page.err != nil || page.status != http.StatusOK || !strings.HasPrefix(page.ctype, "text/html") ||
		!strings.Contains(page.body, "<title>baton run") || !strings.Contains(page.body, `data-lease="`+lease+`"`) {
		t.Errorf("GET /: %d %q %v; want the status page with lease %q's timeline", page.status, page.ctype, page.err, lease)
	}
	r := getHTTP("GET", addr, "/v1/leases/"+lease)
	var lv struct {
		Name     string `json:"name"`
		Holder   string `json:"holder"`
		HeldHere bool   `json:"held_here"`
	}
	if r.err != nil || r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &lv) != nil || lv.Name != lease || lv.Holder != holder {
		t.Errorf("GET /v1/leases/%s: %d %s %v; want holder %q", lease, r.status, r.body, r.err, holder)
	}
	if r := getHTTP("GET", addr, "/v1/leases/other"); r.status != http.StatusNotFound {
		t.Errorf("GET /v1/leases/other: %d, want 404 (this process campaigns for %q only)", r.status, lease)
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/leases/" + lease + "/resign"}, {"GET", "/v1/status"}, {"POST", "/v1/raft/client/session"},
	} {
		if r := getHTTP(c.method, addr, c.path); r.err != nil || (r.status != http.StatusNotFound && r.status != http.StatusMethodNotAllowed) {
			t.Errorf("%s %s: %d %v, want 404 or 405: run's server changes nothing", c.method, c.path, r.status, r.err)
		}
	}
}

// getURLEnv is the URL getMain fetches.
const getURLEnv = "BATON_TEST_URL"

// getMain is this test binary run as a small HTTP client (BATON_TEST_CHILD
// =get): it GETs $BATON_TEST_URL and prints the status code on a line of
// its own, then the body. The network namespace tests run it inside a host
// to ask a baton there (the test process itself never sends to a host).
func getMain() int {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(os.Getenv(getURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode)
	_, _ = io.Copy(os.Stdout, resp.Body)
	return 0
}

// TestRunHTTP runs `baton run --http` on each backend: the leader's health
// check answers 200, the standbys' 429 naming it, through a crash of the
// leader (kill -9) and a SIGTERM; /metrics has the agent's names; the
// status page is served, and no route changes anything.
func TestRunHTTP(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		addr := freePort(t)
		_, port, _ := net.SplitHostPort(addr)
		// A port alone: loopback.
		p := startBaton(t, "baton", testEnv(), "run", "--backend", "memory://", "--lease", "solo", "--id", "solo-1",
			"--http", port, "--", "sleep", "1000")
		waitHealth(t, "baton", addr, http.StatusOK, "solo-1", 0)
		checkMetrics(t, "baton", addr, "solo", true)
		checkReadOnly(t, addr, "solo", "solo-1")
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("exit %d after SIGTERM, want 0", code)
		}
	})
	t.Run("cron", func(t *testing.T) {
		t.Parallel()
		addr := freePort(t)
		startBaton(t, "baton", testEnv(), "cron", "--backend", "memory://", "--lease", "nightly", "--id", "cron-1",
			"--schedule", "@every 1h", "--http", addr, "--", "true")
		waitHealth(t, "baton", addr, http.StatusOK, "cron-1", 0)
		if r := getHTTP("GET", addr, "/"); r.status != http.StatusOK || !strings.Contains(r.body, "<title>baton cron") {
			t.Errorf("cron's status page: %d", r.status)
		}
	})
	t.Run("usage", func(t *testing.T) {
		t.Parallel()
		for _, bad := range []string{"localhost:http", "127.0.0.1:70000", "a:b:c"} {
			r := runBaton(t, 30*time.Second, "run", "--backend", "memory://", "--lease", "x", "--http", bad, "--", "true")
			if r.code != exitUsage || !strings.Contains(r.stderr, "--http") {
				t.Errorf("--http %q: exit %d, stderr %q; want 2 naming --http", bad, r.code, r.stderr)
			}
		}
		// A port in use is a runtime error, reported before connecting.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		r := runBaton(t, 30*time.Second, "run", "--backend", "memory://", "--lease", "x", "--http", ln.Addr().String(), "--", "true")
		if r.code != exitFailure || !strings.Contains(r.stderr, "address already in use") {
			t.Errorf("--http on a port in use: exit %d, stderr %q; want 1", r.code, r.stderr)
		}
	})
	for _, tc := range []struct {
		name string
		args func(t *testing.T) (args func(i int) []string, env []string)
		ttl  string
		n    int
	}{
		{"etcd", func(t *testing.T) (func(int) []string, []string) { return sameBackend(etcdURL(t)) }, "1s", 3},
		{"zookeeper", func(t *testing.T) (func(int) []string, []string) { return sameBackend(zkURL(t, "/services/http")) }, "2s", 3},
		{"consul", func(t *testing.T) (func(int) []string, []string) { return sameBackend(consulURL(t, "/services")) }, "3s", 3},
		{"postgres", func(t *testing.T) (func(int) []string, []string) { return sameBackend(pgURL(t)) }, "2s", 3},
		{"pgbouncer", func(t *testing.T) (func(int) []string, []string) { return sameBackend(pgBouncerURL(t)) }, "2s", 3},
		{"redis", func(t *testing.T) (func(int) []string, []string) { return sameBackend(redisURL(t)) }, "2s", 3},
		// The kubeconfig through KUBECONFIG, as in a shell, not in the URL.
		{"kubernetes", func(t *testing.T) (func(int) []string, []string) {
			return func(int) []string { return []string{"--backend", "k8s://http"} }, []string{"KUBECONFIG=" + kubeconfigFor(t, "http")}
		}, "2s", 3},
		// Five voters: after a crash and a departure three remain, a
		// quorum whatever autopilot has cleaned up by then.
		{"raft", func(t *testing.T) (func(int) []string, []string) {
			args, env := raftGroup(t, 5)
			return func(i int) []string { return append(args(i), "--voters", "5") }, env
		}, "3s", 5}, // raft's floor is 2.21 s (raft.MinTTL)
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args, env := tc.args(t)
			testRunHTTP(t, args, env, tc.ttl, tc.n, tc.name == "raft")
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		addr := freePort(t)
		startBaton(t, "baton", testEnv(), "run", "--backend", "etcd://"+closedPort(t), "--lease", "x",
			"--http", addr, "--", "sleep", "1000")
		h := waitHealth(t, "baton", addr, http.StatusServiceUnavailable, "", 0)
		if h.Status != "undetermined" {
			t.Errorf("health with the backend unreachable: %s, want undetermined", h)
		}
	})
}

// sameBackend returns the flags of members that all use backend.
func sameBackend(backend string) (func(int) []string, []string) {
	return func(int) []string { return []string{"--backend", backend} }, nil
}

func testRunHTTP(t *testing.T, backendArgs func(i int) []string, extraEnv []string, ttl string, n int, raft bool) {
	const lease = "http"
	file := filepath.Join(t.TempDir(), "events")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	killLeftoverChildren(t, file)
	env := testEnv(append([]string{childEnv + "=1", childFileEnv + "=" + file}, extraEnv...)...)
	var procs []*batonProc
	addrs := map[*batonProc]string{}
	ids := map[*batonProc]string{}
	start := func(i int) {
		addr, id := freePort(t), fmt.Sprintf("http-%d", i+1)
		a := append(append([]string{"run"}, backendArgs(i)...), "--lease", lease, "--id", id, "--ttl", ttl, "--grace", "300ms",
			"--http", addr, "--log-level", "debug", "--", self)
		p := startBaton(t, "baton-"+id, env, a...)
		procs = append(procs, p)
		addrs[p], ids[p] = addr, id
	}
	start(0)
	if raft {
		// Alone, the member cannot form its group (it expects n): it is
		// not connected to a backend, and says so.
		h := waitHealth(t, "baton-http-1", addrs[procs[0]], http.StatusServiceUnavailable, "", 0)
		if h.Status != "undetermined" || !strings.Contains(h.Reason, "not connected") {
			t.Errorf("a raft member waiting for its group: %s, want 503 undetermined, not connected", h)
		}
	}
	for i := 1; i < n; i++ {
		start(i)
	}

	// inForce waits until the health of every baton in live agrees on the
	// term in force, the last child started and still running: its baton
	// answers 200 with the child's token, the others 429 naming that baton
	// and token. It returns that child and its baton. On a busy machine a
	// term can end and another begin at any time (a raft group that lost
	// its leader for longer than the TTL expires every session): the check
	// follows the term in force rather than waiting for answers about one
	// that is over.
	inForce := func(when string, live []*batonProc) (event, *batonProc) {
		t.Helper()
		var (
			ev     event
			leader *batonProc
			why    string
		)
		agree := func() bool {
			evs := readEvents(file)
			s := starts(evs)
			if len(s) == 0 {
				why = "no child has started"
				return false
			}
			ev = s[len(s)-1]
			if _, stopped := stopOf(evs, ev.pid); stopped || !alive(ev.pid) {
				why = fmt.Sprintf("the last child (token %d) is gone, and no other has started", ev.token)
				return false
			}
			if leader = procOf(procs, ev.pid); leader == nil || !slices.Contains(live, leader) {
				why = fmt.Sprintf("the last child (token %d) descends from none of the live batons", ev.token)
				return false
			}
			for _, p := range live {
				h := healthOf(addrs[p])
				if p == leader {
					if h.code != http.StatusOK || h.Status != "leader" || h.Lease != lease || h.Holder != ids[p] || h.Token != ev.token {
						why = fmt.Sprintf("the leader %s answers %s, want 200 leader holder=%q token=%d", p.name, h, ids[p], ev.token)
						return false
					}
					continue
				}
				if h.code != http.StatusTooManyRequests || h.Status != "standby" || h.Holder != ids[leader] || h.Token != ev.token {
					why = fmt.Sprintf("the standby %s answers %s, want 429 standby holder=%q token=%d", p.name, h, ids[leader], ev.token)
					return false
				}
			}
			return true
		}
		if !testkit.Poll(30*time.Second, 50*time.Millisecond, agree) {
			t.Fatalf("%s: the batons' health checks do not agree on the term in force within 30s: %s", when, why)
		}
		if ev.holder != ids[leader] {
			t.Errorf("%s: the child's BATON_HOLDER is %q, its baton's --id %q", when, ev.holder, ids[leader])
		}
		return ev, leader
	}
	// startedSince waits for a child to start after the first n.
	startedSince := func(what string, n int) {
		t.Helper()
		testkit.Eventually(t, 60*time.Second, what, func() bool { return len(starts(readEvents(file))) > n })
	}

	startedSince("a child to start", 0)
	first, leader := inForce("first term", procs)
	for _, p := range procs {
		checkMetrics(t, p.name, addrs[p], lease, p == leader)
	}
	checkReadOnly(t, addrs[leader], lease, ids[leader])
	if raft {
		r := getHTTP("GET", addrs[leader], "/v1/group")
		var g struct {
			Voters []string `json:"voters"`
		}
		if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &g) != nil || len(g.Voters) != n {
			t.Errorf("GET /v1/group on a raft member: %d %s, want %d voters", r.status, r.body, n)
		}
		// A member reports its own session's renewals.
		testkit.Eventually(t, 10*time.Second, "the leader's renewal latency to be observed", func() bool {
			v, _ := metricValue(metricsOf(t, addrs[leader]), "baton_renew_latency_seconds", nil)
			return v > 0
		})
	}

	// kill -9: the standbys keep answering 429 naming the dead holder until
	// its lease expires, then one leads with a higher token.
	before := len(starts(readEvents(file)))
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	leader.wait(t, 10*time.Second)
	if h := healthOf(addrs[leader]); h.code != 0 {
		t.Errorf("the killed leader's server still answers: %s", h)
	}
	live := slices.DeleteFunc(slices.Clone(procs), func(p *batonProc) bool { return p == leader })
	startedSince("a standby's child to start after the crash", before)
	second, leader := inForce("after kill -9", live)
	if second.token <= first.token {
		t.Errorf("token after the crash %d, want more than %d", second.token, first.token)
	}
	checkMetrics(t, leader.name, addrs[leader], lease, true)

	// SIGTERM: the leader stops its command, resigns and exits 0; the last
	// baton leads.
	before = len(starts(readEvents(file)))
	if err := leader.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := leader.wait(t, 30*time.Second); code != 0 {
		t.Errorf("baton exited %d after SIGTERM, want 0", code)
	}
	live = slices.DeleteFunc(live, func(p *batonProc) bool { return p == leader })
	startedSince("the last baton's child to start after the hand-over", before)
	third, last := inForce("after SIGTERM", live)
	if third.token <= second.token {
		t.Errorf("token after the hand-over %d, want more than %d", third.token, second.token)
	}
	// The last baton saw the terms: the others' as a standby, its own last.
	testkit.Eventually(t, 10*time.Second, "the last baton to count at least 2 elections (another's and its own)", func() bool {
		v, _ := metricValue(metricsOf(t, addrs[last]), "baton_transitions_total", map[string]string{"lease": lease, "kind": "elected"})
		return v >= 2
	})
}
