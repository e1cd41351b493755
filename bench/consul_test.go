package bench

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

func init() { targets = append(targets, namedTarget{"consul", consulTarget}) }

// consulTarget runs against one real `consul agent -dev` (v1.20.6, built
// from the tools module); every simulated process has its own client
// behind its own proxy, so that killing a process cuts it off without
// destroying its session, as kill -9 would. The agent's session_ttl_min is
// lowered so that the one-second failover TTL is allowed.
func consulTarget(b *testing.B) target {
	return consulTargetOn(testserver.StartConsul(b, testserver.ConsulOptions{}))
}

// consulTargetOn is consulTarget on an agent already started.
func consulTargetOn(srv *testserver.Consul) target {
	var n atomic.Int64
	return target{
		name: "consul",
		new: func(b *testing.B, cfg backend.Config) *process {
			proxy := testserver.StartProxy(b, srv.Addr())
			tr := http.DefaultTransport.(*http.Transport).Clone()
			// A process with many leases has up to
			// consul.DefaultMaxRequests requests and 16 blocking
			// queries in flight: with the clone's 2 idle connections,
			// each would open one of its own (and two more in the
			// proxy beside it); as many idle ones keep them reused, as
			// consul.NewClient does.
			tr.MaxIdleConnsPerHost = consul.DefaultMaxRequests + 16
			// Uncompressed answers, as consul.NewClient asks for.
			tr.DisableCompression = true
			client, err := api.NewClient(&api.Config{
				Address:    proxy.Addr(),
				HttpClient: &http.Client{Transport: countingRoundTripper{tr, &n}},
			})
			if err != nil {
				b.Fatal(err)
			}
			be, err := consul.New(client, consul.Options{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = be.Close(ctx)
				tr.CloseIdleConnections()
			})
			return &process{backend: be, kill: proxy.Cut}
		},
		requests: n.Load,
	}
}

// countingRoundTripper counts HTTP requests; a blocking query is one.
type countingRoundTripper struct {
	http.RoundTripper
	n *atomic.Int64
}

func (c countingRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.RoundTripper.RoundTrip(r)
}

// BenchmarkConsulChangeCost: what one change costs a Consul Backend that
// holds 10,000 leases (TTL 10 s), once its watch has settled: each
// iteration's window holds 10 changes (a lease resigned and won again, a
// second apart), after a warm-up change that lets the watch split its
// keys into groups. Reported: entries/change, the KV entries the Backend read
// in its recursive blocking queries' answers per change (all its keys
// would be 20,000: a lock and an epoch key per lease), cpu-ms/change, the
// process's CPU time per change beyond its idle rate, and queries, the
// blocking queries the Backend keeps open.
//
//	go test -run '^$' -bench ConsulChangeCost -benchtime 1x -timeout 30m ./bench
func BenchmarkConsulChangeCost(b *testing.B) {
	srv := testserver.StartConsul(b, testserver.ConsulOptions{})
	n := benchci.Size(10000, 1200)
	lc := testserver.NewConsulReads()
	client, err := api.NewClient(&api.Config{Address: srv.Addr(), HttpClient: &http.Client{Transport: lc}})
	if err != nil {
		b.Fatal(err)
	}
	be, err := consul.New(client, consul.Options{Config: backend.Config{TTL: 10 * time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = be.Close(ctx)
	})
	p := &process{backend: be}
	terms := holdMany(b, be, fmt.Sprintf("change-%d", time.Now().UnixNano()), n)
	// The watch splits its keys at a change after a quiet second: a
	// warm-up change after a pause, then time for the groups' first
	// reads; not synchronisation (queries reports what it came to).
	time.Sleep(benchci.Size(5*time.Second, 2*time.Second))
	if err := terms[0].Resign(context.Background()); err != nil {
		b.Fatal(err)
	}
	terms[0] = mustCampaign(b, p, terms[0].Lease(), "many")
	time.Sleep(benchci.Size(5*time.Second, 2*time.Second))
	idle0, idleStart := testkit.CPUTime(), time.Now()
	time.Sleep(benchci.Size(5*time.Second, time.Second)) // the idle rate's window
	idleRate := float64(testkit.CPUTime()-idle0) / float64(time.Since(idleStart))
	const changes = 10
	var entries, cpuMs float64
	for b.Loop() {
		e0, cpu0, start := lc.Entries(), testkit.CPUTime(), time.Now()
		for c := range changes {
			i := (c*997 + 13) % n // spread over the leases
			if err := terms[i].Resign(context.Background()); err != nil {
				b.Fatal(err)
			}
			terms[i] = mustCampaign(b, p, terms[i].Lease(), "many")
			time.Sleep(time.Second) // the pace of the changes, not synchronisation
		}
		busy := float64(testkit.CPUTime()-cpu0) - idleRate*float64(time.Since(start))
		entries = float64(lc.Entries()-e0) / changes
		cpuMs = busy / 1e6 / changes
	}
	b.ReportMetric(entries, "entries/change")
	b.ReportMetric(max(cpuMs, 0), "cpu-ms/change")
	b.ReportMetric(float64(lc.Prefixes()), "queries")
}

// At CI's size (1,200 leases: 2,400 keys, enough to be split) it checks
// that the benchmark still runs.
var _ = benchci.Register(BenchmarkConsulChangeCost, "entries/change>0", "cpu-ms/change>=0", "queries>0")
