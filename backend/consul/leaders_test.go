package consul_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestLeadersReadManyPerRequest: Leaders reads 64 leases a request (their
// lock and epoch keys in one read-only transaction), and answers for each
// what Leader does; a name that makes no key fails alone.
func TestLeadersReadManyPerRequest(t *testing.T) {
	agent := testserver.SharedConsul(t)
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: testPrefix()}
	holder := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	var reads atomic.Int64
	c := hookedClient(t, agent, func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error) {
		if !strings.HasPrefix(r.URL.Path, "/v1/session/") {
			reads.Add(1)
		}
		return send()
	})
	reader := newBackend(t, c, opts, nil)
	const n = 150
	names := make([]string, n+1)
	for i := range n {
		names[i] = fmt.Sprintf("many-%03d", i)
		if i%3 == 0 {
			testkit.CampaignWithin(t, holder, names[i], "h", 10*time.Second)
		}
	}
	names[n] = "bad//name"
	recs, errs := reader.Leaders(t.Context(), names)
	if got, want := reads.Load(), int64((n+63)/64); got != want {
		t.Errorf("Leaders of %d leases sent %d requests; want %d (64 leases a request)", n, got, want)
	}
	if len(recs) != len(names) || len(errs) != len(names) {
		t.Fatalf("Leaders answered %d records and %d errors for %d names", len(recs), len(errs), len(names))
	}
	for i, name := range names[:n] {
		want, werr := holder.Leader(t.Context(), name)
		if recs[i] != want || !errors.Is(errs[i], baton.ErrNoLeader) != (werr == nil) {
			t.Errorf("Leaders[%s] = %+v, %v; Leader = %+v, %v", name, recs[i], errs[i], want, werr)
		}
	}
	if errs[n] == nil {
		t.Errorf("Leaders[%q] answered %+v; want the error of a name that makes no key", names[n], recs[n])
	}
}

// TestLeadersOnServersWithoutGetOrEmpty: servers older than Consul 1.14
// refuse the transaction verb get-or-empty as unknown; Leaders then reads
// one lease a request, with the same answers. The agent here is new: the
// test sends it a verb it does not know instead, and the agent's own
// refusal is what the Backend sees.
func TestLeadersOnServersWithoutGetOrEmpty(t *testing.T) {
	agent := testserver.SharedConsul(t)
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: testPrefix()}
	holder := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	var txns atomic.Int64
	c := hookedClient(t, agent, func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error) {
		if r.URL.Path == "/v1/txn" && r.Body != nil {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return nil, err
			}
			if bytes.Contains(body, []byte(`"get-or-empty"`)) {
				txns.Add(1)
				body = bytes.ReplaceAll(body, []byte(`"get-or-empty"`), []byte(`"get-or-nothing"`))
			}
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		return send()
	})
	reader := newBackend(t, c, opts, nil)
	testkit.CampaignWithin(t, holder, "old-1", "h", 10*time.Second)
	for range 2 {
		recs, errs := reader.Leaders(t.Context(), []string{"old-0", "old-1"})
		if !errors.Is(errs[0], baton.ErrNoLeader) || errs[1] != nil || recs[1].Holder != "h" {
			t.Fatalf("Leaders on servers without get-or-empty = %+v, %v; want no leader, then h", recs, errs)
		}
	}
	if got := txns.Load(); got != 1 {
		t.Errorf("Leaders tried get-or-empty %d times; want once, then one read a lease", got)
	}
}
