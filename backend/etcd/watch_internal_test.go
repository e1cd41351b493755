package etcd

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestManyLeasesOneWatch: a Backend holding many leases needs no goroutine
// per lease (one watch sees every held key, one timer per session keeps
// safe-until), and a key deleted behind its back still ends exactly its
// own term, also after the watch was stopped and restarted.
func TestManyLeasesOneWatch(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := NewTestClient(t, srv.Endpoint())
	b := startBackend(t, c, backend.Config{TTL: 5 * time.Second})
	const n = 200
	testkit.CampaignWithin(t, b, "warm-up", "x", 10*time.Second)
	before := runtime.NumGoroutine()
	terms := make([]*stateTerm, n)
	for i := range terms {
		terms[i] = testkit.CampaignWithin(t, b, fmt.Sprintf("many-%03d", i), "x", 10*time.Second).(*stateTerm)
	}
	if grown := runtime.NumGoroutine() - before; grown > n/10 {
		t.Errorf("holding %d more leases started %d goroutines; want a handful, not one per lease", n, grown)
	}
	del := func(i int) {
		t.Helper()
		if _, err := c.Delete(testkit.Context(t, 5*time.Second), terms[i].h.key); err != nil {
			t.Fatal(err)
		}
	}
	lost := func(is ...int) {
		t.Helper()
		for _, i := range is {
			testkit.WaitDone(t, terms[i], 10*time.Second)
			if !errors.Is(terms[i].Err(), baton.ErrLeaseLost) {
				t.Fatalf("lease %d: Err() = %v, want ErrLeaseLost", i, terms[i].Err())
			}
		}
	}
	del(3)
	del(150)
	lost(3, 150)

	// Keys deleted while the watch is down: the restarted watch must not
	// miss them.
	b.held.mu.Lock()
	b.held.restart()
	del(7)
	del(199)
	b.held.mu.Unlock()
	lost(7, 199)

	for i, term := range terms {
		switch i {
		case 3, 150, 7, 199:
			continue
		}
		if err := term.Err(); err != nil {
			t.Fatalf("lease %d ended with %v; only the deleted keys' terms may end", i, err)
		}
	}
	// The names of the lost terms are free again.
	testkit.CampaignWithin(t, b, "many-003", "x", 10*time.Second)
}
