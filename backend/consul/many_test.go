package consul_test

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestManyLeasesNoGoroutineEach: a Backend holding many leases needs no
// goroutine per lease (the watcher's one query judges every held key, one
// timer per session keeps safe-until), and a held key deleted behind its
// back still ends exactly its own term.
func TestManyLeasesNoGoroutineEach(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)
	const n = 100
	testkit.CampaignWithin(t, b, "warm-up", "x", 10*time.Second)
	before := runtime.NumGoroutine()
	terms := make([]baton.Term, n)
	for i := range terms {
		terms[i] = testkit.CampaignWithin(t, b, fmt.Sprintf("many-%03d", i), "x", 10*time.Second)
	}
	if grown := runtime.NumGoroutine() - before; grown > n/10 {
		t.Errorf("holding %d more leases started %d goroutines; want a handful, not one per lease", n, grown)
	}
	for _, i := range []int{4, 77} {
		if _, err := c.KV().Delete(fmt.Sprintf("%smany-%03d/.lock", prefix, i), nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{4, 77} {
		testkit.WaitDone(t, terms[i], 10*time.Second)
		if !errors.Is(terms[i].Err(), baton.ErrLeaseLost) {
			t.Fatalf("lease %d: Err() = %v, want ErrLeaseLost", i, terms[i].Err())
		}
	}
	for i, term := range terms {
		if i != 4 && i != 77 && term.Err() != nil {
			t.Fatalf("lease %d ended with %v; only the deleted keys' terms may end", i, term.Err())
		}
	}
	// A lost lease's name is free again.
	testkit.CampaignWithin(t, b, "many-004", "x", 10*time.Second)
}

// connGauge counts a Proxy's open client connections and their peak.
type connGauge struct {
	mu         sync.Mutex
	open, peak int
}

func (g *connGauge) tap() io.Writer {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open++
	g.peak = max(g.peak, g.open)
	return gaugeConn{g}
}

func (g *connGauge) Peak() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak
}

type gaugeConn struct{ g *connGauge }

func (c gaugeConn) Write(p []byte) (int, error) { return len(p), nil }

func (c gaugeConn) Close() error {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	c.g.open--
	return nil
}

// TestManyCampaignsAtOnceKeepFewConnections: a Backend campaigning for
// many leases at once (a balance instance starting with thousands) keeps
// its requests to the agent within a bounded number of connections, well
// under the agent's default limit of 200 per client address
// (limits.http_max_conns_per_client), past which the agent refuses
// connections with 429, and every campaign still wins.
func TestManyCampaignsAtOnceKeepFewConnections(t *testing.T) {
	agent := testserver.SharedConsul(t)
	proxy := testserver.StartProxy(t, agent.Addr())
	var g connGauge
	proxy.TapClient(g.tap)
	b := newBackend(t, agentClient(t, agent, proxy.Addr()), consul.Options{Prefix: testPrefix()}, nil)
	testkit.CampaignBurst(t, b, "burst", "x", 1000, 2*time.Minute)
	t.Logf("peak connections: %d", g.Peak())
	// DefaultMaxRequests, the watch's blocking queries, the session's
	// requests and connections closing: well under the agent's 200.
	if peak := g.Peak(); peak > 100 {
		t.Errorf("the Backend opened %d connections to the agent at once; want at most 100", peak)
	}
}
