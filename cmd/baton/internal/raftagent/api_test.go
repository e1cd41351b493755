package raftagent

import (
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/httpjson"
	"github.com/batonhq/baton/internal/testkit"
)

// rfc3339ms is how the API writes times.
var rfc3339ms = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

type leasesBody struct {
	Leases []leaseWire `json:"leases"`
}

// leaseWire is leaseJSON as a client decodes it.
type leaseWire struct {
	Name            string  `json:"name"`
	Holder          string  `json:"holder"`
	Token           uint64  `json:"token,string"`
	Since           *string `json:"since"`
	SafeUntil       *string `json:"safe_until"`
	Member          string  `json:"member"`
	HeldHere        bool    `json:"held_here"`
	Waiters         int     `json:"waiters"`
	ResignRequested bool    `json:"resign_requested"`
}

type resignWire struct {
	Status string     `json:"status"`
	Lease  *leaseWire `json:"lease"`
	Ended  *struct {
		Holder string `json:"holder"`
		Token  uint64 `json:"token,string"`
		Kind   string `json:"kind"`
		Reason string `json:"reason"`
	} `json:"ended"`
}

type healthWire struct {
	Status string   `json:"status"`
	Lease  string   `json:"lease"`
	Holder string   `json:"holder"`
	Token  uint64   `json:"token,string"`
	Reason string   `json:"reason"`
	Leases []string `json:"leases"`
}

// One group of three members; the agent under test is member 0; member 1
// serves the API too.
func TestAgentAPI(t *testing.T) {
	g := newGroup(t, 3, nil)
	m0, m1 := g.nodes[0], g.nodes[1]
	const token = "agent-test-token"
	h0 := newHandler(t, m0, Options{Token: token})
	agent0 := agentServer(t, m0, h0)
	h1 := newHandler(t, m1, Options{})
	agent1 := agentServer(t, m1, h1)
	ttl := 3 * time.Second
	here := backend(t, m0, ttl)      // a Backend on the agent's member
	elsewhere := backend(t, m1, ttl) // one on another member

	t.Run("Leases", func(t *testing.T) {
		const name = "reports/nightly" // a slash, escaped in the path
		ta := testkit.Campaign(t, here, name, "worker-a")
		waiting := testkit.CampaignAsync(t, elsewhere, name, "worker-b")
		var got leaseWire
		testkit.Eventually(t, 20*time.Second, "worker-b queued in /v1/leases", func() bool {
			var body leasesBody
			r := call(t, "GET", agent0, "/v1/leases")
			if r.status != http.StatusOK {
				t.Fatalf("GET /v1/leases: %d %s", r.status, r.body)
			}
			r.decode(t, &body)
			i := slices.IndexFunc(body.Leases, func(l leaseWire) bool { return l.Name == name })
			if i < 0 {
				t.Fatalf("GET /v1/leases lacks %q: %s", name, r.body)
			}
			got = body.Leases[i]
			return got.Waiters == 1
		})
		if got.Holder != "worker-a" || got.Token != ta.Token() || got.Member != m0.ID() || !got.HeldHere || got.ResignRequested {
			t.Errorf("lease = %+v, want worker-a with token %d via %s, held here", got, ta.Token(), m0.ID())
		}
		if got.Since == nil || !rfc3339ms.MatchString(*got.Since) || got.SafeUntil == nil || !rfc3339ms.MatchString(*got.SafeUntil) {
			t.Errorf("since %v, safe_until %v: want RFC 3339 UTC with milliseconds", deref(got.Since), deref(got.SafeUntil))
		}
		if su, _ := time.Parse(time.RFC3339, deref(got.SafeUntil)); su.Before(time.Now().Add(-time.Second)) {
			t.Errorf("safe_until %s is in the past of a held lease", deref(got.SafeUntil))
		}

		r := call(t, "GET", agent0, "/v1/leases/reports%2Fnightly")
		var one leaseWire
		r.decode(t, &one)
		if r.status != http.StatusOK || one.Name != name || one.Token != ta.Token() {
			t.Errorf("GET /v1/leases/reports%%2Fnightly: %d %s", r.status, r.body)
		}
		// From the other member the lease is the same, but not held there.
		call(t, "GET", agent1, "/v1/leases/reports%2Fnightly").decode(t, &one)
		if one.Holder != "worker-a" || one.HeldHere {
			t.Errorf("member 1 sees %+v, want worker-a, not held here", one)
		}

		r = call(t, "GET", agent0, "/v1/leases/no-such-lease")
		var e httpjson.ErrorBody
		r.decode(t, &e)
		if r.status != http.StatusNotFound || e.Lease != "no-such-lease" || !strings.Contains(e.Error, `"no-such-lease"`) {
			t.Errorf("GET unknown lease: %d %s, want 404 naming it", r.status, r.body)
		}
		if err := ta.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		testkit.WaitTerm(t, waiting, testkit.CampaignTimeout)
	})

	t.Run("Health", func(t *testing.T) {
		const name = "health-check"
		testkit.Campaign(t, here, name, "worker-a")
		r := call(t, "GET", agent0, "/v1/health/leader?lease="+name)
		var hb healthWire
		r.decode(t, &hb)
		if r.status != http.StatusOK || hb.Status != "leader" || hb.Holder != "worker-a" {
			t.Errorf("agent of the holder: %d %s, want 200 leader", r.status, r.body)
		}
		r = call(t, "GET", agent1, "/v1/health/leader?lease="+name)
		r.decode(t, &hb)
		if r.status != http.StatusTooManyRequests || hb.Status != "standby" || hb.Holder != "worker-a" {
			t.Errorf("another agent: %d %s, want 429 standby", r.status, r.body)
		}
		r = call(t, "HEAD", agent1, "/v1/health/leader?lease="+name)
		if r.status != http.StatusTooManyRequests || r.body != "" {
			t.Errorf("HEAD: %d %q, want 429 and no body", r.status, r.body)
		}
		r = call(t, "GET", agent0, "/v1/health/leader?lease=nobody-holds-this")
		r.decode(t, &hb)
		if r.status != http.StatusServiceUnavailable || hb.Status != "undetermined" || !strings.Contains(hb.Reason, "nobody holds") {
			t.Errorf("a lease nobody holds: %d %s, want 503", r.status, r.body)
		}
		r = call(t, "GET", agent0, "/v1/health/leader")
		r.decode(t, &hb)
		if r.status != http.StatusBadRequest || !slices.Contains(hb.Leases, name) || !strings.Contains(hb.Reason, "?lease=NAME") {
			t.Errorf("no ?lease with several leases: %d %s, want 400 listing them", r.status, r.body)
		}
		// Each member counts the election once it applied it, which may
		// be after the raft leader answered the reads above.
		testkit.Eventually(t, 10*time.Second, "member 0 counting worker-a as leader", func() bool {
			return metric(t, h0, "baton_is_leader", map[string]string{"lease": name}) == 1
		})
		testkit.Eventually(t, 10*time.Second, "member 1 applied the election", func() bool {
			_, counted := sample(t, h1.opts.Metrics.Registry(), "baton_is_leader", map[string]string{"lease": name})
			return counted && metric(t, h1, "baton_transitions_total", map[string]string{"lease": name, "kind": "elected", "reason": ""}) == 1
		})
		if v := metric(t, h1, "baton_is_leader", map[string]string{"lease": name}); v != 0 {
			t.Errorf("member 1: baton_is_leader{lease=%q} = %v, want 0", name, v)
		}
	})

	t.Run("Resign", func(t *testing.T) {
		const name = "resign-me"
		// The holder is an agent:// client of the agent under test, as
		// `baton run --backend agent://` would be.
		client, err := raft.Dial(agent0, raft.ClientOptions{Token: testToken, PlainTCP: true})
		if err != nil {
			t.Fatal(err)
		}
		ta := testkit.Campaign(t, backend(t, client, ttl), name, "worker-a")
		aStopped := resignWhenAsked(t, ta, 500*time.Millisecond)
		waiting := testkit.CampaignAsync(t, elsewhere, name, "worker-b")
		testkit.Eventually(t, 20*time.Second, "worker-b queued", func() bool {
			in, err := m0.Lease(t.Context(), name)
			return err == nil && in.Waiters == 1
		})
		path := "/v1/leases/" + name + "/resign"
		r := call(t, "POST", agent0, path)
		if r.status != http.StatusUnauthorized || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("no token: %d %v %s, want 401 with WWW-Authenticate: Bearer", r.status, r.header, r.body)
		}
		r = call(t, "POST", agent0, path, "Authorization", "Bearer wrong-token")
		if r.status != http.StatusUnauthorized {
			t.Errorf("wrong token: %d %s, want 401", r.status, r.body)
		}
		r = call(t, "POST", agent0, path, "Authorization", "Bearer "+token, "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example")
		if r.status != http.StatusForbidden {
			t.Errorf("cross-site browser request: %d %s, want 403", r.status, r.body)
		}
		if ta.Err() != nil {
			t.Fatalf("refused calls ended the term: %v", ta.Err())
		}
		r = call(t, "POST", agent0, "/v1/leases/nobody-holds-this/resign", "Authorization", "Bearer "+token)
		if r.status != http.StatusNotFound {
			t.Errorf("resign of a lease nobody holds: %d %s, want 404", r.status, r.body)
		}
		r = call(t, "POST", agent0, path+"?wait=soon", "Authorization", "Bearer "+token)
		if r.status != http.StatusBadRequest {
			t.Errorf("bad wait: %d %s, want 400", r.status, r.body)
		}

		r = call(t, "POST", agent0, path+"?wait=30s", "Authorization", "bearer "+token)
		var rb resignWire
		r.decode(t, &rb)
		if r.status != http.StatusOK || rb.Status != "released" || rb.Ended == nil {
			t.Fatalf("resign: %d %s, want 200 released", r.status, r.body)
		}
		if rb.Ended.Holder != "worker-a" || rb.Ended.Token != ta.Token() || rb.Ended.Reason != "resign-requested" {
			t.Errorf("ended = %+v, want worker-a's term %d, resign-requested", *rb.Ended, ta.Token())
		}
		select {
		case <-ta.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the holder's term did not end")
		}
		if !errors.Is(ta.Err(), baton.ErrResigned) {
			t.Errorf("holder's term ended with %v, want ErrResigned", ta.Err())
		}
		won := testkit.WaitTerm(t, waiting, testkit.CampaignTimeout)
		tb, elected := won.Term, won.At
		if stopped := <-aStopped; elected.Before(stopped) {
			t.Errorf("worker-b was elected at %v, before worker-a's work stopped at %v", elected, stopped)
		}
		resignWhenAsked(t, tb, 0)
		if tb.Token() <= ta.Token() {
			t.Errorf("worker-b's token %d is not above worker-a's %d", tb.Token(), ta.Token())
		}
		// The answer's state is read after the release: the waiter holds.
		if rb.Lease == nil || rb.Lease.Holder != "worker-b" || rb.Lease.Token != tb.Token() {
			t.Errorf("lease after resign = %+v, want worker-b with token %d", rb.Lease, tb.Token())
		}

		// With ?wait=0 the answer comes once the request is committed.
		r = call(t, "POST", agent0, path+"?wait=0", "Authorization", "Bearer "+token)
		r.decode(t, &rb)
		if r.status != http.StatusAccepted || rb.Status != "requested" {
			t.Errorf("resign with wait=0: %d %s, want 202 requested", r.status, r.body)
		}
		select {
		case <-tb.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("worker-b's term did not end after the second resign")
		}
		if !errors.Is(tb.Err(), baton.ErrResigned) {
			t.Errorf("worker-b's term ended with %v, want ErrResigned", tb.Err())
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return "<null>"
	}
	return *s
}
