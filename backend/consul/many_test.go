package consul_test

import (
	"errors"
	"fmt"
	"runtime"
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
