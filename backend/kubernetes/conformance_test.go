package kubernetes_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// leaseRules are the only permissions the Backend needs: what the RBAC
// Role of docs/kubernetes.md grants.
var leaseRules = []rbacv1.PolicyRule{{
	APIGroups: []string{coordinationv1.GroupName},
	Resources: []string{"leases"},
	Verbs:     []string{"get", "watch", "create", "update"},
}}

// grantLeases makes a namespace named after prefix, lets
// testserver.KubeUser use the leases in it, and nothing else, and returns
// its name.
func grantLeases(t *testing.T, srv *testserver.KubeAPIServer, prefix string) string {
	t.Helper()
	ns := testkit.Unique(prefix)
	if err := srv.Grant(testkit.Context(t, 30*time.Second), ns, testserver.KubeUser, leaseRules); err != nil {
		t.Fatal(err)
	}
	return ns
}

// conformanceTTL is the suite's TTL here, backend.DefaultTTL. Every held
// Lease is written once per RenewInterval (TTL/3), so
// ThousandLeasesOneSession asks for 1,000/(TTL/3) Lease updates a second:
// 3,000 at the suite's default of 1 s, which the test kube-apiserver, its
// etcd and the race-enabled client sharing a loaded two-core machine could
// not sustain (lease 0 expired after 18 s); 600 at 5 s passed alone but
// failed beside a fuzzing run (a lease expired after 24 s); 300 at 10 s
// leaves room for the other packages' tests that run beside it in CI.
const conformanceTTL = 10 * time.Second

// TestConformance runs the whole suite against a real kube-apiserver, as a
// user that may only get, watch, create and update leases in its
// namespace.
func TestConformance(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	batontest.Run(t, target(srv, grantLeases(t, srv, "baton-conformance"), conformanceTTL))
}

// TestLeaderWatch: a standby hears who holds a Lease from the Backend's
// watch (baton.LeaderWatcher), without asking; a killed holder stays named
// until its successor took the Lease over, and the successor is heard next.
func TestLeaderWatch(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	tg := target(srv, grantLeases(t, srv, "baton-leaderwatch"), 2*time.Second)
	tg.KeepsKilledHolder = true
	batontest.LeaderWatch(t, tg)
}

// target is the conformance target of Backends on the Leases of ns, each
// process reaching the server through a proxy of its own, which Kill and
// Cut close.
func target(srv *testserver.KubeAPIServer, ns string, minTTL time.Duration) batontest.Target {
	return batontest.Target{MinTTL: minTTL, New: func(t *testing.T, cfg backend.Config) *batontest.Process {
		proxy := testserver.StartProxy(t, srv.Addr())
		rc := restConfig(srv, "https://"+proxy.Addr(), testserver.KubeUser)
		rc.QPS = -1 // no client-side rate limit: ThousandLeasesOneSession writes hundreds a second
		b, err := kubernetes.NewForConfig(rc, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: cfg}, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = b.Close(ctx)
		})
		return &batontest.Process{Backend: b, Kill: proxy.Cut, Cut: proxy.Cut, Heal: proxy.Heal}
	}}
}

// TestTokensRiseAcrossDeletedLeases runs batontest.TokensRiseAcrossDataLoss
// with the store's loss being every Lease of the namespace deleted (what
// `kubectl delete lease --all` does): the new Lease's leaseTransitions
// start again from 1, and its epoch annotation must put its tokens above
// the old ones.
func TestTokensRiseAcrossDeletedLeases(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	ns := grantLeases(t, srv, "baton-dataloss")
	admin, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeAdminUser))
	if err != nil {
		t.Fatal(err)
	}
	batontest.TokensRiseAcrossDataLoss(t, batontest.DataLoss{
		New: func(t *testing.T, logger *slog.Logger) baton.Backend {
			b, err := kubernetes.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeUser),
				kubernetes.Options{RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: time.Second}, Logger: logger}, Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Lose: func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := admin.CoordinationV1().Leases(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				t.Fatalf("delete the leases: %v", err)
			}
		},
	})
}

// countingTransport counts the requests a client sends: reads (GET without
// watch=true) and watches.
type countingTransport struct {
	rt             http.RoundTripper
	reads, watches atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet {
		if r.URL.Query().Get("watch") == "true" {
			c.watches.Add(1)
		} else {
			c.reads.Add(1)
		}
	}
	return c.rt.RoundTrip(r)
}

// TestLeaderWatchFromEvents checks that a standby learns each new holder
// from the watch's events, not by reading the Lease: through a hand-over
// and a release, its WatchLeader reads the Lease once and opens one watch,
// and the holder's renewals reach fn not at all.
func TestLeaderWatchFromEvents(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	ns := grantLeases(t, srv, "baton-watchevents")
	const lease = "watched"
	cfg := backend.Config{TTL: 2 * time.Second}
	counter := &countingTransport{}
	wrc := restConfig(srv, srv.Host(), testserver.KubeUser)
	wrc.Wrap(func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter })
	w, err := kubernetes.NewForConfig(wrc, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: cfg}, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CloseAtEnd(t, w, 5*time.Second)
	newBackend := func() *kubernetes.Backend {
		b, err := kubernetes.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeUser), kubernetes.Options{RecordOptions: backend.RecordOptions{Config: cfg}, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		return testkit.CloseAtEnd(t, b, 5*time.Second)
	}
	a, b := newBackend(), newBackend()

	heard := make(chan string, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- w.WatchLeader(ctx, lease, func(rec baton.Record, err error) {
			switch {
			case errors.Is(err, baton.ErrNoLeader):
				heard <- "nobody"
			case err != nil:
				heard <- "error: " + err.Error()
			default:
				heard <- rec.Holder
			}
		})
	}()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchLeader returned %v after its context ended, want context.Canceled", err)
		}
	}()
	next := func(want string) {
		t.Helper()
		select {
		case got := <-heard:
			if got != want {
				t.Fatalf("the watch said %q, want %q", got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the watch did not say %q", want)
		}
	}
	next("nobody")
	ta := testkit.CampaignWithin(t, a, lease, "a", 10*time.Second)
	next("a")
	for range 3 {
		su := ta.SafeUntil()
		testkit.Eventually(t, 10*time.Second, "a to renew", func() bool { return ta.SafeUntil().After(su) })
	}
	won := testkit.CampaignAsync(t, b, lease, "b")
	resignTerm(t, ta)
	// b may or may not have been waiting: the watch may hear the release.
	got := ""
	select {
	case got = <-heard:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not hear a's resign")
	}
	if got == "nobody" {
		next("b")
	} else if got != "b" {
		t.Fatalf("the watch said %q after a resigned, want b (or nobody, then b)", got)
	}
	tb := testkit.WaitTerm(t, won, 30*time.Second).Term
	resignTerm(t, tb)
	next("nobody")
	select {
	case got := <-heard:
		t.Errorf("the watch said %q more than each change", got)
	default:
	}
	if r, n := counter.reads.Load(), counter.watches.Load(); r != 1 || n != 1 {
		t.Errorf("the watching Backend read the Lease %d times and opened %d watches; want one read and one watch", r, n)
	}
}
