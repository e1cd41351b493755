package raftagent

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// sample returns the value of the gauge, or the observation count of the
// histogram, name with labels in reg; ok is false when reg has none.
func sample(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) (v float64, ok bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			if m.GetHistogram() != nil {
				return float64(m.GetHistogram().GetSampleCount()), true
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// mval returns the value of m's metric name with labels (0 when absent).
func mval(t testing.TB, m *Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := sample(t, m.Registry(), name, labels)
	return v
}

// metric returns the value of h's metric name with labels (0 when absent).
func metric(t testing.TB, h *Handler, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := sample(t, h.opts.Metrics.Registry(), name, labels)
	return v
}

// histCount is the number of observations of a histogram (0 when absent).
func histCount(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	v, _ := sample(t, reg, name, labels)
	return uint64(v)
}

// Every metric, from real lease events of a one-member group: a hand-over
// by Resign, a session that expires while holding, renewals, a scrape.
func TestAgentMetrics(t *testing.T) {
	m := NewMetrics()
	g := newGroup(t, 1, func(_ int, o *raft.NodeOptions) { o.OnRenew = m.OnRenew })
	n := g.nodes[0]
	h := newHandler(t, n, Options{Metrics: m})
	agent := agentServer(t, n, h)
	reg := m.Registry()
	ttl := 2 * time.Second

	// A hand-over: a holds, b queues, a resigns, b is elected.
	const job = "metrics-job"
	ba, bb := backend(t, n, ttl), backend(t, n, ttl)
	ta := testkit.Campaign(t, ba, job, "a")
	waiting := testkit.CampaignAsync(t, bb, job, "b")
	testkit.Eventually(t, 10*time.Second, "b queued", func() bool {
		return mval(t, m, "baton_transitions_total", map[string]string{"lease": job, "kind": "queued", "reason": ""}) == 1
	})
	if v := mval(t, m, "baton_is_leader", map[string]string{"lease": job}); v != 1 {
		t.Errorf("baton_is_leader{lease=%q} = %v while a holds, want 1", job, v)
	}
	if err := ta.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	testkit.WaitTerm(t, waiting, testkit.CampaignTimeout)
	lj := map[string]string{"lease": job}
	testkit.Eventually(t, 10*time.Second, "the hand-over counted", func() bool {
		return mval(t, m, "baton_transitions_total", map[string]string{"lease": job, "kind": "elected", "reason": ""}) == 2
	})
	if v := mval(t, m, "baton_transitions_total", map[string]string{"lease": job, "kind": "released", "reason": "resigned"}); v != 1 {
		t.Errorf(`baton_transitions_total{kind="released",reason="resigned"} = %v, want 1`, v)
	}
	if v := mval(t, m, "baton_is_leader", map[string]string{"lease": job}); v != 1 {
		t.Errorf("baton_is_leader = %v with b (a client of this member) holding, want 1", v)
	}
	if c := histCount(t, reg, "baton_term_duration_seconds", lj); c != 1 {
		t.Errorf("baton_term_duration_seconds count = %d, want 1 (a's term)", c)
	}
	if c := histCount(t, reg, "baton_campaign_wait_seconds", lj); c != 1 {
		t.Errorf("baton_campaign_wait_seconds count = %d, want 1 (b's wait)", c)
	}

	// The scrape-time read: b's safe-until lies ahead.
	if margin, ok := sample(t, reg, "baton_safe_until_margin_seconds", lj); !ok || margin <= 0 || margin > ttl.Seconds() {
		t.Errorf("baton_safe_until_margin_seconds{lease=%q} = %v (present %v), want in (0, %v]", job, margin, ok, ttl.Seconds())
	}
	if up, _ := sample(t, reg, "baton_lease_table_up", nil); up != 1 {
		t.Errorf("baton_lease_table_up = %v, want 1", up)
	}

	// Renewals: the Backends renew through this member.
	testkit.Eventually(t, 10*time.Second, "renewals observed", func() bool {
		return histCount(t, reg, "baton_renew_latency_seconds", nil) > 0
	})
	// A client whose session the group no longer has renews in vain, as
	// one does after a long partition.
	req, err := http.NewRequest("POST", "http://"+agent+"/v1/raft/client/renew", strings.NewReader(`{"session":"s-gone","secret":"0123456789abcdef0123"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("renewing an unknown session: %s, want 404", resp.Status)
	}
	if v := mval(t, m, "baton_renew_errors_total", nil); v < 1 {
		t.Errorf("baton_renew_errors_total = %v after a failed renewal, want >= 1", v)
	}

	// A holder cut off from the agent: the raft leader expires its
	// session, and the term is lost.
	const lost = "metrics-lost"
	proxy := testserver.StartProxy(t, agent)
	client, err := raft.Dial(proxy.Addr(), raft.ClientOptions{Token: testToken, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	tc := testkit.Campaign(t, backend(t, client, ttl), lost, "c")
	// The gauge follows the group's lease events, which reach the agent a
	// moment after the grant reached c.
	testkit.Eventually(t, 10*time.Second, "baton_is_leader{lease=\""+lost+"\"} = 1 while c holds", func() bool {
		return mval(t, m, "baton_is_leader", map[string]string{"lease": lost}) == 1
	})
	proxy.Cut()
	testkit.Eventually(t, 30*time.Second, "c's session expired in the group", func() bool {
		return mval(t, m, "baton_transitions_total", map[string]string{"lease": lost, "kind": "lost", "reason": "session-expired"}) == 1
	})
	if v := mval(t, m, "baton_is_leader", map[string]string{"lease": lost}); v != 0 {
		t.Errorf("baton_is_leader{lease=%q} = %v after the term was lost, want 0", lost, v)
	}
	if c := histCount(t, reg, "baton_term_duration_seconds", map[string]string{"lease": lost}); c != 1 {
		t.Errorf("baton_term_duration_seconds{lease=%q} count = %d, want 1", lost, c)
	}
	select {
	case <-tc.Done():
	case <-time.After(10 * time.Second):
		t.Error("c's term did not end at its safe-until")
	}

	// GET /metrics serves it all, with the Go and process collectors.
	r := call(t, "GET", agent, "/metrics")
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	for _, want := range []string{
		`baton_is_leader{lease="metrics-job"} 1`,
		`baton_transitions_total{kind="lost",lease="metrics-lost",reason="session-expired"} 1`,
		"# HELP baton_renew_latency_seconds ", "baton_renew_errors_total ", "baton_safe_until_margin_seconds{",
		"baton_campaign_wait_seconds_count{", "baton_term_duration_seconds_bucket{", "go_goroutines ", "process_open_fds ",
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
	// And it lints clean.
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "baton_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}
