package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// gatedUpdates is a transport that, once armed, holds every Lease update
// (PUT) until open is closed, counting how many it holds at once, or, with
// delay set, makes each update take that much longer (a slow API server).
type gatedUpdates struct {
	rt    http.RoundTripper
	open  chan struct{}
	delay time.Duration
	armed atomic.Bool

	held, peak atomic.Int64
}

func (g *gatedUpdates) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPut || !g.armed.Load() {
		return g.rt.RoundTrip(r)
	}
	n := g.held.Add(1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	if g.open != nil {
		select {
		case <-g.open:
		case <-r.Context().Done():
		}
	}
	if g.delay > 0 {
		select {
		case <-time.After(g.delay): // the slow server's reply time
		case <-r.Context().Done():
		}
	}
	g.held.Add(-1)
	return g.rt.RoundTrip(r)
}

// holdMany starts a Backend through g and has it hold n fresh Leases.
func holdMany(t *testing.T, g *gatedUpdates, n int, opts kubernetes.Options) (*kubernetes.Backend, []baton.Term) {
	t.Helper()
	srv := testserver.SharedKubeAPIServer(t)
	rc := restConfig(srv, srv.Host(), testserver.KubeAdminUser)
	rc.QPS = -1
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { g.rt = rt; return g }
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kubernetes.New(cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testkit.Unique("many")
	terms := make([]baton.Term, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			term, err := b.Campaign(ctx, fmt.Sprintf("%s-%03d", prefix, i), baton.Candidate{ID: "many"})
			if err != nil {
				t.Errorf("campaign %d: %v", i, err)
				return
			}
			terms[i] = term
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return b, terms
}

// TestRenewalsOfManyLeasesRunAtOnce: each Lease is an object of its own,
// renewed by an update of its own, so a process holding thousands of
// Leases renews them within RenewInterval only if many updates are in
// flight at once (a round takes leases × round trip / concurrency). With
// every update held at the transport, the renewals of 300 Leases must put
// at least 100 updates in flight together.
func TestRenewalsOfManyLeasesRunAtOnce(t *testing.T) {
	g := &gatedUpdates{open: make(chan struct{})}
	b, _ := holdMany(t, g, 300, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: 3 * time.Second}}})
	g.armed.Store(true) // from the next round on, which renews all 300
	ok := testkit.Poll(10*time.Second, 10*time.Millisecond, func() bool { return g.held.Load() >= 100 })
	close(g.open)
	if !ok {
		t.Errorf("at most %d Lease updates were in flight at once for 300 held Leases, want at least 100", g.peak.Load())
	}
	testkit.CloseAtEnd(t, b, 30*time.Second)
}

// TestRenewalsFallingBehindAreLoud: when the API server cannot take the
// updates of every held Lease within RenewInterval, the Backend says so
// (a warning per round) and the terms end at their safe-until, never
// later, rather than holding on unrenewed.
func TestRenewalsFallingBehindAreLoud(t *testing.T) {
	var logs testserver.SyncBuffer
	ttl := 2 * time.Second
	g := &gatedUpdates{delay: ttl / 4}
	b, terms := holdMany(t, g, 12, kubernetes.Options{RecordOptions: backend.RecordOptions{
		Config:           backend.Config{TTL: ttl},
		RenewConcurrency: 1,
		Logger:           slog.New(slog.NewTextHandler(&logs, nil)),
	}})
	g.armed.Store(true)
	testkit.CloseAtEnd(t, b, 30*time.Second)
	t.Cleanup(func() { g.armed.Store(false) }) // before the Close above: its releases at full speed
	testkit.Eventually(t, 30*time.Second, "a warning that renewals are not keeping up", func() bool {
		return strings.Contains(logs.String(), "renewals are not keeping up")
	})
	// A round of 12 updates of TTL/4 each lasts 3 TTLs: some terms must
	// end, each by its safe-until.
	testkit.Eventually(t, 30*time.Second, "a term ended by its safe-until", func() bool {
		for _, term := range terms {
			select {
			case <-term.Done():
				return true
			default:
			}
		}
		return false
	})
	for i, term := range terms {
		select {
		case <-term.Done():
			if !errors.Is(term.Err(), baton.ErrExpired) {
				t.Errorf("term %d ended with %v, want its safe-until passed (%v)", i, term.Err(), baton.ErrExpired)
			}
		default:
		}
	}
}
