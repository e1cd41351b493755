package raftagent

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testhook"
	"github.com/batonhq/baton/internal/testkit"
)

// Lease names and candidate IDs come from whoever campaigns: the page
// escapes them, and its Content-Security-Policy would not run an injected
// script anyway.
func TestAgentPageEscapes(t *testing.T) {
	g := newGroup(t, 1, nil)
	n := g.nodes[0]
	agent := agentServer(t, n, newHandler(t, n, Options{}))
	const (
		lease  = `<script>alert("lease")</script>`
		holder = `"><img src=x onerror=alert(1)>`
	)
	testkit.Campaign(t, backend(t, n, 3*time.Second), lease, holder)
	var page response
	testkit.Eventually(t, 10*time.Second, "the page drawing the term", func() bool {
		page = call(t, "GET", agent, "/")
		return strings.Contains(page.body, `class="term running"`)
	})
	if page.status != http.StatusOK || !strings.HasPrefix(page.header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", page.status, page.header)
	}
	for _, raw := range []string{`<script>alert(`, `<img src=x`, `"><img`} {
		if strings.Contains(page.body, raw) {
			t.Errorf("the page contains %q unescaped", raw)
		}
	}
	for _, esc := range []string{`&lt;script&gt;alert(&#34;lease&#34;)&lt;/script&gt;`, `&#34;&gt;&lt;img src=x onerror=alert(1)&gt;`} {
		if !strings.Contains(page.body, esc) {
			t.Errorf("the page lacks the escaped %q", esc)
		}
	}
	// The lease's link escapes the name in the path.
	if !strings.Contains(page.body, `href="v1/leases/%3Cscript%3Ealert%28%22lease%22%29%3C%2Fscript%3E"`) {
		t.Errorf("the page lacks the lease's escaped link")
	}
	if !regexp.MustCompile(`<rect class="term running"[^>]* data-lease="&lt;script&gt;alert\(&#34;lease&#34;\)&lt;/script&gt;" data-token="\d+" data-holder="&#34;&gt;&lt;img src=x onerror=alert\(1\)&gt;"`).MatchString(page.body) {
		t.Errorf("the term's rect lacks the escaped data attributes:\n%s", page.body)
	}

	// The one inline script and style block are what the policy allows.
	csp := page.header.Get("Content-Security-Policy")
	for _, block := range []string{`<script>(?s:(.*?))</script>`, `<style>(?s:(.*?))</style>`} {
		m := regexp.MustCompile(block).FindAllStringSubmatch(page.body, -1)
		if len(m) != 1 {
			t.Fatalf("%d blocks matching %s, want 1", len(m), block)
		}
		sum := sha256.Sum256([]byte(m[0][1]))
		if h := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, h) {
			t.Errorf("CSP %q does not allow the page's block (%s)", csp, h)
		}
	}
	if !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q does not default to none", csp)
	}

	// The live part the script fetches is the same, escaped.
	live := call(t, "GET", agent, "/ui/live?window=5m")
	if live.status != http.StatusOK || strings.Contains(live.body, `<script>alert(`) || !strings.Contains(live.body, `data-lease="&lt;script&gt;`) {
		t.Errorf("GET /ui/live: %d, escaped: %v", live.status, !strings.Contains(live.body, `<script>alert(`))
	}
	if !strings.Contains(live.body, `<a href="?window=5m" class="active">5m</a>`) {
		t.Errorf("GET /ui/live?window=5m does not mark the 5m zoom active")
	}
	if r := call(t, "GET", agent, "/no-such-page"); r.status != http.StatusNotFound {
		t.Errorf("GET /no-such-page: %d, want 404", r.status)
	}
}

// With its group's quorum gone, the agent says it cannot tell: health 503,
// a scrape that answers (with the table down), a page that says why.
func TestAgentUndetermined(t *testing.T) {
	g := newGroup(t, 3, nil)
	m0 := g.nodes[0]
	h := newHandler(t, m0, Options{ReadTimeout: 500 * time.Millisecond})
	agent := agentServer(t, m0, h)
	testkit.Campaign(t, backend(t, m0, 3*time.Second), "only-lease", "worker-a")
	// The group's only lease: no ?lease needed.
	r := call(t, "GET", agent, "/v1/health/leader")
	var hb healthWire
	r.decode(t, &hb)
	if r.status != http.StatusOK || hb.Lease != "only-lease" || hb.Status != "leader" {
		t.Fatalf("health with one lease: %d %s, want 200 leader of only-lease", r.status, r.body)
	}
	// The term must be in this member's log before the quorum goes: the
	// timeline is drawn from the events it applied.
	testkit.Eventually(t, 10*time.Second, "member 0 applying the election", func() bool {
		return metric(t, h, "baton_transitions_total", map[string]string{"lease": "only-lease", "kind": "elected", "reason": ""}) == 1
	})
	for _, n := range g.nodes[1:] {
		_ = testhook.KillRaftNode(n)
	}
	testkit.Eventually(t, 30*time.Second, "health 503 after the quorum went", func() bool {
		r = call(t, "GET", agent, "/v1/health/leader?lease=only-lease")
		return r.status == http.StatusServiceUnavailable
	})
	r.decode(t, &hb)
	if hb.Status != "undetermined" || hb.Reason == "" {
		t.Errorf("health body %s, want undetermined with a reason", r.body)
	}
	m := call(t, "GET", agent, "/metrics")
	if m.status != http.StatusOK || !strings.Contains(m.body, "baton_lease_table_up 0") {
		t.Errorf("GET /metrics without a quorum: %d, want 200 with baton_lease_table_up 0", m.status)
	}
	if r := call(t, "GET", agent, "/v1/leases"); r.status != http.StatusServiceUnavailable {
		t.Errorf("GET /v1/leases without a quorum: %d, want 503", r.status)
	}
	page := call(t, "GET", agent, "/")
	if page.status != http.StatusOK || !strings.Contains(page.body, "undetermined") || !strings.Contains(page.body, "Could not read the lease table") {
		t.Errorf("the page without a quorum: %d; says undetermined: %v", page.status, strings.Contains(page.body, "undetermined"))
	}
	// The timeline still shows the term this agent saw.
	if !strings.Contains(page.body, `data-lease="only-lease"`) {
		t.Errorf("the timeline lost only-lease's term")
	}
}
