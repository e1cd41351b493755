package kubernetes_test

import (
	"fmt"
	"net/http"
	"path"
	"sync"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// requestCount counts one client's requests by method.
type requestCount struct {
	rt http.RoundTripper
	mu sync.Mutex
	n  map[string]int
}

func (c *requestCount) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	if r.URL.Query().Get("watch") != "" {
		c.n["WATCH"]++
	} else {
		c.n[r.Method]++
		// And by the object: "PUT name".
		c.n[r.Method+" "+path.Base(r.URL.Path)]++
	}
	c.mu.Unlock()
	return c.rt.RoundTrip(r)
}

func (c *requestCount) get(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

// countedBackend is a Backend on a client of its own whose requests c
// counts: a process of its own, to the API server.
func countedBackend(t *testing.T, srv *testserver.KubeAPIServer, ttl time.Duration) (*kubernetes.Backend, *requestCount) {
	t.Helper()
	c := &requestCount{n: map[string]int{}}
	rc := restConfig(srv, srv.Host(), testserver.KubeAdminUser)
	rc.QPS = -1
	rc.ContentType = "application/vnd.kubernetes.protobuf" // as NewForConfig sets it
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { c.rt = rt; return c }
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kubernetes.New(cs, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: ttl}}})
	if err != nil {
		t.Fatal(err)
	}
	return testkit.CloseAtEnd(t, b, 30*time.Second), c
}

// TestWaitersReadNothingWhileTheHolderRenews: the watch's events carry the
// Lease, so a waiting process learns of each renewal, and of the
// release and the next holder's write at a hand-over, with no read. Five
// waiting processes on one Lease make no GET of it while the holder renews
// three times and then hands over; the hand-over costs the Lease one
// update by a waiting process (the queue's head taking it).
func TestWaitersReadNothingWhileTheHolderRenews(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	// A waiting process that is not the queue's head leaves a released
	// Lease to the head for a tenth of the TTL: 600 ms, which a head on a
	// loaded machine takes the Lease within.
	ttl := 6 * time.Second
	lease := testkit.Unique("herd")
	holder, hc := countedBackend(t, srv, ttl)
	term := testkit.Campaign(t, holder, lease, "holder")

	const waiters = 5
	counts := make([]*requestCount, waiters)
	won := make(chan testkit.Won, waiters)
	for i := range waiters {
		b, c := countedBackend(t, srv, ttl)
		counts[i] = c
		ch := testkit.CampaignAsync(t, b, lease, fmt.Sprintf("waiter-%d", i))
		go func() { won <- <-ch }()
	}
	// Each waiter has read the Lease once and watches it.
	testkit.Eventually(t, 30*time.Second, "every waiter reading once and watching", func() bool {
		for _, c := range counts {
			if c.get("GET "+lease) == 0 || c.get("WATCH") == 0 {
				return false
			}
		}
		return true
	})
	gets := func() (n int) {
		for _, c := range counts {
			n += c.get("GET " + lease)
		}
		return n
	}
	before := gets()
	puts := hc.get(http.MethodPut)
	testkit.Eventually(t, 30*time.Second, "three renewals by the holder", func() bool { return hc.get(http.MethodPut) >= puts+3 })
	if d := gets() - before; d != 0 {
		t.Errorf("the waiting processes made %d GETs while the holder renewed 3 times, want 0", d)
	}

	updates := func() (n int) {
		for _, c := range counts {
			n += c.get("PUT " + lease)
		}
		return n
	}
	putsBefore := updates()
	resignTerm(t, term)
	w := testkit.WaitTerm(t, won, 30*time.Second)
	if d := gets() - before; d != 0 {
		t.Errorf("the waiting processes made %d GETs over renewals and a hand-over, want 0", d)
	}
	// Wait until the new holder has renewed once: by then every loser
	// has seen its write.
	su := w.Term.SafeUntil()
	testkit.Eventually(t, 30*time.Second, "the new holder renewing", func() bool { return w.Term.SafeUntil().After(su) })
	if d := updates() - putsBefore; d > 2 {
		t.Errorf("the hand-over and one renewal took %d updates of the Lease by the waiting processes, want at most 2 (the head's take, its renewal)", d)
	}
	if d := gets() - before; d != 0 {
		t.Errorf("the waiting processes made %d GETs, want 0", d)
	}
}

// TestReleaseWakesOneWaitingProcess: the processes waiting for a Lease
// queue in a second object beside it, and a release names the queue's
// head, so that at each hand-over one waiting process updates the Lease
// (the head, taking it) instead of every one of them, and the Lease goes
// to the processes in the order they came.
func TestReleaseWakesOneWaitingProcess(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	// The others leave a released Lease to the head for a tenth of the
	// TTL, 1 s: long enough for a head on a loaded machine.
	ttl := 10 * time.Second
	lease := testkit.Unique("queue")
	holder, _ := countedBackend(t, srv, ttl)
	term := testkit.Campaign(t, holder, lease, "holder")

	const waiters = 5
	counts := make([]*requestCount, waiters)
	won := make([]<-chan testkit.Won, waiters)
	for i := range waiters {
		b, c := countedBackend(t, srv, ttl)
		counts[i] = c
		won[i] = testkit.CampaignAsync(t, b, lease, fmt.Sprintf("waiter-%d", i))
		// One after the other, so that the queue's order is known: each
		// has joined the queue (created or updated its object) before the
		// next starts.
		testkit.Eventually(t, 30*time.Second, "the waiter queueing", func() bool {
			return c.get("POST leases")+c.get("PUT "+lease+kubernetes.QueueSuffix) > 0
		})
	}
	leaseUpdates := func(i int) int { return counts[i].get("PUT " + lease) }
	for i := range waiters {
		before := make([]int, waiters)
		for j := range waiters {
			before[j] = leaseUpdates(j)
		}
		resignTerm(t, term)
		var w testkit.Won
		winner := -1
		testkit.Eventually(t, 30*time.Second, "a waiter taking the Lease", func() bool {
			for j := i; j < waiters; j++ {
				select {
				case w = <-won[j]:
					winner = j
					return true
				default:
				}
			}
			return false
		})
		if winner != i {
			t.Fatalf("hand-over %d went to waiter-%d, want waiter-%d, which had waited longest", i, winner, i)
		}
		for j := range waiters {
			if j == i || j == i-1 {
				continue // the winner; the releaser, which held the Lease
			}
			if d := leaseUpdates(j) - before[j]; d != 0 {
				t.Errorf("hand-over %d to waiter-%d: waiter-%d updated the Lease %d times, want 0", i, i, j, d)
			}
		}
		term = w.Term
	}
}
