package statusapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/internal/testkit"
)

type healthAnswer struct {
	code   int
	Status string `json:"status"`
	Holder string `json:"holder"`
	Token  uint64 `json:"token,string"`
	Reason string `json:"reason"`
}

func getHealth(t *testing.T, url string) healthAnswer {
	t.Helper()
	resp, err := http.Get(url + "/v1/health/leader")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := healthAnswer{code: resp.StatusCode}
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("health: %d %s: %v", resp.StatusCode, b, err)
	}
	return a
}

// candidate is one process's campaign with its status API.
type candidate struct {
	src  *ElectorSource
	h    *Handler
	url  string
	e    *baton.Elector
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// newCandidate serves id's campaign for lease on b; run starts it.
func newCandidate(t *testing.T, b baton.Backend, lease, id string) *candidate {
	t.Helper()
	c := &candidate{src: NewElectorSource(lease, id)}
	h, err := New(c.src, Options{Kind: "run", Here: "this process"})
	if err != nil {
		t.Fatal(err)
	}
	c.h = h
	srv := httptest.NewServer(h)
	c.url = srv.URL
	cfg := baton.ElectorConfig{Lease: lease, Candidate: baton.Candidate{ID: id}}
	c.src.Hooks(&cfg)
	if c.e, err = baton.NewElector(b, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.stop != nil {
			c.stop()
		}
		c.wg.Wait()
		srv.Close()
		h.Close()
		c.src.Close()
	})
	return c
}

func (c *candidate) attach(b baton.Backend) { c.src.Attach(b, c.e, nil) }

func (c *candidate) run() {
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	c.wg.Go(func() {
		_ = c.e.Run(ctx, func(ctx context.Context, _ baton.Term) error { <-ctx.Done(); return nil })
	})
}

// The health check of an ElectorSource: 503 until the backend is open, 200
// only from the process's own term, 429 naming another holder, and 503 when
// the backend names this process but its Elector does not lead.
func TestElectorSourceHealth(t *testing.T) {
	store := memory.NewStore()
	open := func() baton.Backend {
		b, err := memory.New(store, memory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		return b
	}
	b1, b2, b3 := open(), open(), open()
	p1 := newCandidate(t, b1, "job", "p1")
	if a := getHealth(t, p1.url); a.code != http.StatusServiceUnavailable || a.Status != "undetermined" {
		t.Errorf("before the backend is open: %+v, want 503", a)
	}
	p1.attach(b1)
	if a := getHealth(t, p1.url); a.code != http.StatusServiceUnavailable || !strings.Contains(a.Reason, "nobody holds") {
		t.Errorf("nobody holds the lease: %+v, want 503", a)
	}
	resp, err := http.Get(p1.url + "/v1/leases/job")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/leases/job with nobody holding it: %s, want 200 (free)", resp.Status)
	}
	p1.run()
	testkit.Eventually(t, 10*time.Second, "p1 to answer 200", func() bool { return getHealth(t, p1.url).code == http.StatusOK })
	first := getHealth(t, p1.url)
	if first.Holder != "p1" || first.Token == 0 || first.Status != "leader" {
		t.Errorf("p1 leading: %+v", first)
	}

	p2 := newCandidate(t, b2, "job", "p2")
	p2.attach(b2)
	p2.run()
	if a := getHealth(t, p2.url); a.code != http.StatusTooManyRequests || a.Holder != "p1" || a.Token != first.Token {
		t.Errorf("p2 standing by: %+v, want 429 naming p1", a)
	}

	// A source whose candidate ID the backend names while its own Elector
	// does not lead (a term that just ended here, or not yet begun): it
	// cannot tell, and must not say 200.
	ghost := newCandidate(t, b3, "job", "p1")
	ghost.attach(b3)
	if a := getHealth(t, ghost.url); a.code != http.StatusServiceUnavailable {
		t.Errorf("the backend names this process, its Elector does not lead: %+v, want 503", a)
	}

	// p1 resigns: p2 leads with a higher token, p1 stands by behind it.
	p1.stop()
	p1.wg.Wait()
	testkit.Eventually(t, 10*time.Second, "p2 to answer 200", func() bool { return getHealth(t, p2.url).code == http.StatusOK })
	second := getHealth(t, p2.url)
	if second.Token <= first.Token {
		t.Errorf("token after the hand-over %d, want more than %d", second.Token, first.Token)
	}
	if a := getHealth(t, p1.url); a.code != http.StatusTooManyRequests || a.Holder != "p2" {
		t.Errorf("p1 after resigning: %+v, want 429 naming p2", a)
	}
	// p1's own term is in its metrics: elected, then released.
	reg := p1.h.opts.Metrics.Registry()
	testkit.Eventually(t, 10*time.Second, "p1's metrics to show its term", func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var elected, released bool
		for _, mf := range mfs {
			if mf.GetName() != "baton_transitions_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				elected = elected || (l["kind"] == "elected" && m.GetCounter().GetValue() >= 1)
				released = released || (l["kind"] == "released" && l["reason"] == "resigned")
			}
		}
		return elected && released
	})
}
