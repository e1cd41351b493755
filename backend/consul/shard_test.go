package consul_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// TestChangeReadsItsGroupOnly: a Backend holding many leases learns of a
// change to one of them by re-reading a group of keys around it, not every
// key it watches. Consul's KV API has no per-key change feed on a prefix
// (and no filter on a listing), so the Backend splits its watched keys
// into groups, each with a blocking query on its own prefix, at a change
// after a quiet while: a change then wakes the one query whose prefix
// holds the key.
func TestChangeReadsItsGroupOnly(t *testing.T) {
	agent := testserver.SharedConsul(t)
	counter := testserver.NewConsulReads()
	cfg := &api.Config{Address: agent.Addr(), Scheme: "http", Token: agent.ManagementToken(), HttpClient: &http.Client{Transport: counter}}
	if caFile, _, _ := agent.TLSFiles(); caFile != "" {
		t.Fatal("the shared agent serves TLS, and the counting client speaks plain HTTP: give the client the agent's CA")
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)
	const n = 600
	terms := make([]baton.Term, n)
	for i := range terms {
		terms[i] = testkit.CampaignWithin(t, b, fmt.Sprintf("many-%03d", i), "x", 10*time.Second)
	}
	// Each lease has two keys (its lock and its epoch): reading them all
	// is 2n entries. At a change after a quiet while the watcher splits
	// them by the digit after "many-": six groups. The test makes such a
	// change (a key of its own under the prefix) whenever a while passed
	// since its last.
	other := agentClient(t, agent, agent.Addr()).KV()
	var nudged time.Time
	testkit.Eventually(t, 30*time.Second, "the watched keys to be split into groups", func() bool {
		if counter.Prefixes() >= 6 {
			return true
		}
		if time.Since(nudged) > 2*time.Second {
			nudged = time.Now()
			if _, err := other.Put(&api.KVPair{Key: prefix + "many-000/nudge", Value: []byte(nudged.String())}, nil); err != nil {
				t.Fatal(err)
			}
		}
		return false
	})
	mark := counter.Answers()
	victim := 123
	if _, err := other.Delete(fmt.Sprintf("%smany-%03d/.lock", prefix, victim), nil); err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, terms[victim], 10*time.Second)
	if !errors.Is(terms[victim].Err(), baton.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", terms[victim].Err())
	}
	for _, size := range counter.AnswersSince(mark) {
		if size >= n {
			t.Errorf("after one key changed, the Backend read %d entries in one answer (%d leases, %d keys); want a group of them, fewer than %d", size, n, 2*n, n)
		}
	}
	for i, term := range terms {
		if i != victim && term.Err() != nil {
			t.Fatalf("lease %d ended with %v; only the deleted key's term may end", i, term.Err())
		}
	}
}
