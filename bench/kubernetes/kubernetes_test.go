package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testserver"
)

// The timing of both electors: client-go's defaults (and
// controller-runtime's), and baton's TTL at the same lease duration. baton
// renews every TTL/3; client-go's holder renews, and its followers poll,
// every RetryPeriod (with up to 120 % jitter). The small size (benchci)
// keeps client-go's proportions.
var (
	leaseDuration = benchci.Size(15*time.Second, 3*time.Second)
	renewDeadline = benchci.Size(10*time.Second, 2*time.Second)
	retryPeriod   = benchci.Size(2*time.Second, 400*time.Millisecond)
)

// A client-go holder ends phaseMin plus up to phaseSpread (uniformly
// drawn) after its follower first read the Lease: several of the
// follower's retry cycles (2 to 4.4 s each), so that the end falls at a
// random point of one.
var (
	phaseMin    = benchci.Size(5*time.Second, time.Second)
	phaseSpread = benchci.Size(10*time.Second, time.Second)
)

const namespace = "default"

var (
	// requestsWindow is the window over which requests are counted.
	requestsWindow = benchci.Size(60*time.Second, 2*time.Second)
	// warmUp is left out of the count: the standbys' first reads and
	// watches.
	warmUp = benchci.Size(5*time.Second, time.Second)
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopSharedKubeAPIServer()
	os.Exit(code)
}

// apiServer is the one kube-apiserver every benchmark of the run uses, so
// that both electors meet the same server.
func apiServer(b *testing.B) *testserver.KubeAPIServer {
	b.Helper()
	return testserver.SharedKubeAPIServer(b)
}

// counter counts the HTTP requests of one process by type (get, update,
// create, watch), as the server receives them: a watch is one request
// however many events it carries.
type counter struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *counter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

type countingTransport struct {
	http.RoundTripper
	c *counter
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	kind := map[string]string{http.MethodGet: "get", http.MethodPut: "update", http.MethodPost: "create"}[r.Method]
	if w := r.URL.Query().Get("watch"); w == "true" || w == "1" {
		kind = "watch"
	}
	if kind == "" {
		kind = strings.ToLower(r.Method)
	}
	t.c.mu.Lock()
	t.c.n[kind]++
	t.c.mu.Unlock()
	return t.RoundTripper.RoundTrip(r)
}

// proc is one simulated process: its own client, counted, reaching the
// server through a proxy of its own, which crash cuts (what kill -9 looks
// like to the server: the process stops writing, and never releases).
type proc struct {
	proxy *testserver.Proxy
	count *counter
	cs    k8s.Interface
}

func newProc(b *testing.B, srv *testserver.KubeAPIServer) *proc {
	b.Helper()
	p := &proc{proxy: testserver.StartProxy(b, srv.Addr()), count: &counter{n: map[string]int64{}}}
	cfg := &rest.Config{
		Host:            "https://" + p.proxy.Addr(),
		BearerToken:     srv.Token(testserver.KubeAdminUser),
		TLSClientConfig: rest.TLSClientConfig{CAData: srv.CAData()},
		WrapTransport:   func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, p.count} },
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	p.cs = cs
	return p
}

func (p *proc) crash() { p.proxy.Cut() }

// baton returns a baton Backend of the process, TTL leaseDuration.
func (p *proc) baton(b *testing.B) *kubernetes.Backend {
	b.Helper()
	return p.batonWith(b, backend.Config{TTL: leaseDuration})
}

// batonWith returns a baton Backend of the process with cfg, closed at the
// end of the benchmark.
func (p *proc) batonWith(b *testing.B, cfg backend.Config) *kubernetes.Backend {
	b.Helper()
	be, err := kubernetes.New(p.cs, kubernetes.Options{
		RecordOptions: backend.RecordOptions{Config: cfg},
		Namespace:     namespace,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = be.Close(ctx)
	})
	return be
}

// clientGo is client-go's LeaderElector in a process, running until stop
// (which releases the Lease if it leads: ReleaseOnCancel) or until it
// loses the Lease.
type clientGo struct {
	le      *leaderelection.LeaderElector
	started chan time.Time // when OnStartedLeading ran
	cancel  context.CancelFunc
	done    chan struct{}
}

// clientGo starts client-go's elector in the process on lease as id.
func (p *proc) clientGo(b *testing.B, lease, id string) *clientGo {
	b.Helper()
	e := &clientGo{started: make(chan time.Time, 1), done: make(chan struct{})}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: lease, Namespace: namespace},
			Client:     p.cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		},
		LeaseDuration:   leaseDuration,
		RenewDeadline:   renewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: true,
		Name:            lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { e.started <- time.Now() },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	e.le = le
	var ctx context.Context
	ctx, e.cancel = context.WithCancel(context.Background())
	go func() {
		defer close(e.done)
		le.Run(ctx)
	}()
	b.Cleanup(e.stop)
	return e
}

// stop ends the elector's Run (releasing the Lease if it leads) and waits
// for it.
func (e *clientGo) stop() {
	e.cancel()
	<-e.done
}

// waitFor polls cond every 10 ms until it holds, failing after d.
func waitFor(b *testing.B, d time.Duration, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// receive waits up to d for the time on ch.
func receive(b *testing.B, ch <-chan time.Time, d time.Duration, what string) time.Time {
	b.Helper()
	select {
	case at := <-ch:
		return at
	case <-time.After(d):
		b.Fatalf("%s: not within %s", what, d)
		return time.Time{}
	}
}

func report(b *testing.B, samples []time.Duration, what string) {
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, what+"-median-ms")
	b.ReportMetric(float64(samples[len(samples)-1].Microseconds())/1000, what+"-max-ms")
	b.Logf("%s: %v", what, samples)
}

// uniqueLease returns a Lease name no earlier iteration used.
func uniqueLease(kind string, i int) string {
	return fmt.Sprintf("%s-%d-%d", kind, time.Now().UnixNano(), i)
}

// batonHandOver measures, per iteration, the time from the holder's end
// (crashed or resigned) to the acquisition of a baton candidate waiting in
// another process.
func batonHandOver(b *testing.B, crash bool) {
	srv := apiServer(b)
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		lease := uniqueLease("baton", i)
		holder, waiter := newProc(b, srv), newProc(b, srv)
		hb, wb := holder.baton(b), waiter.baton(b)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		th, err := hb.Campaign(ctx, lease, baton.Candidate{ID: "holder"})
		if err != nil {
			cancel()
			b.Fatalf("holder's campaign: %v", err)
		}
		won := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			if _, err := wb.Campaign(ctx, lease, baton.Candidate{ID: "waiter"}); err != nil {
				errc <- err
				return
			}
			won <- time.Now()
		}()
		// The waiter has read the holder's record and waits; the
		// holder has renewed once, as a running holder has.
		first := th.SafeUntil()
		waitFor(b, 2*leaseDuration, "the holder to renew", func() bool { return th.SafeUntil().After(first) })
		// The holder ends at a random point of its renew interval
		// (TTL/3), as a real crash does (the delay itself, not
		// synchronisation).
		time.Sleep(rand.N(leaseDuration / 3))
		start := time.Now()
		if crash {
			holder.crash()
		} else if err := th.Resign(context.Background()); err != nil {
			b.Fatalf("resign: %v", err)
		}
		select {
		case at := <-won:
			samples = append(samples, at.Sub(start))
		case err := <-errc:
			b.Fatalf("waiter's campaign: %v", err)
		}
		cancel()
	}
	report(b, samples, "failover")
}

// clientGoHandOver is batonHandOver for client-go's LeaderElector: the
// holder's process crashes, or its elector stops (ReleaseOnCancel), and the
// time until the follower's OnStartedLeading is measured.
func clientGoHandOver(b *testing.B, crash bool) {
	srv := apiServer(b)
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		lease := uniqueLease("client-go", i)
		holderProc := newProc(b, srv)
		holder := holderProc.clientGo(b, lease, "holder")
		receive(b, holder.started, 2*leaseDuration, "the holder to lead")
		follower := newProc(b, srv).clientGo(b, lease, "follower")
		// The follower has read the holder's record; the holder has
		// renewed since it was elected.
		waitFor(b, 2*leaseDuration, "the follower to see the holder", func() bool { return follower.le.GetLeader() == "holder" })
		// The holder ends at a random moment of the follower's retry
		// cycle, as a real crash or release does: the follower's first
		// read came just before, so a fixed delay would end the holder at
		// the same point of every cycle (right before the earliest next
		// read, for a delay of one RetryPeriod). This is the delay itself,
		// not synchronisation.
		time.Sleep(phaseMin + rand.N(phaseSpread))
		start := time.Now()
		if crash {
			// The process's client can no longer reach the server; its
			// elector gives up after RenewDeadline and never releases.
			holderProc.crash()
		} else {
			holder.stop()
		}
		samples = append(samples, receive(b, follower.started, 4*leaseDuration, "the follower to lead").Sub(start))
		// The crashed elector's last requests fail at once rather than
		// wait out the TLS handshake timeout on the cut link.
		holderProc.proxy.Close()
	}
	report(b, samples, "failover")
}

// BenchmarkKubernetesCrashFailover: the holder's process vanishes (its
// connection to the API server is cut, as kill -9 would end it); time until
// the contender waiting in another process leads. baton and client-go, lease
// duration 15 s each.
func BenchmarkKubernetesCrashFailover(b *testing.B) {
	b.Run("baton", func(b *testing.B) { batonHandOver(b, true) })
	b.Run("client-go", func(b *testing.B) { clientGoHandOver(b, true) })
}

// BenchmarkKubernetesGracefulHandOver: the holder resigns (baton's
// Term.Resign; client-go's elector stopped with ReleaseOnCancel); time
// until the contender waiting in another process leads. baton's waiter
// watches the Lease; client-go's follower polls it every RetryPeriod.
func BenchmarkKubernetesGracefulHandOver(b *testing.B) {
	b.Run("baton", func(b *testing.B) { batonHandOver(b, false) })
	b.Run("client-go", func(b *testing.B) { clientGoHandOver(b, false) })
}

// BenchmarkKubernetesRequests: requests per process per second of baton
// and of client-go's elector, 1 holder + 2 standbys each (three processes,
// each with its own client), on one Lease per tool of one kube-apiserver,
// lease duration 15 s each, over one 60 s window per iteration. Counted:
// HTTP requests as the client sends them; a watch is one.
func BenchmarkKubernetesRequests(b *testing.B) {
	srv := apiServer(b)
	roles := []string{"holder", "standby-1", "standby-2"}
	type side struct {
		tool  string
		procs []*proc
		check func() error // nil while the holder has led throughout
	}

	// baton: the holder first, then two standbys campaigning.
	bl := uniqueLease("baton-reqs", 0)
	batonSide := side{tool: "baton"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var th baton.Term
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	standbyWon := make(chan string, len(roles))
	for i, role := range roles {
		p := newProc(b, srv)
		batonSide.procs = append(batonSide.procs, p)
		be := p.baton(b)
		if i == 0 {
			var err error
			if th, err = be.Campaign(ctx, bl, baton.Candidate{ID: role}); err != nil {
				b.Fatalf("baton holder's campaign: %v", err)
			}
			continue
		}
		wg.Go(func() {
			if _, err := be.Campaign(ctx, bl, baton.Candidate{ID: role}); err == nil {
				standbyWon <- role
			}
		})
	}
	batonSide.check = func() error {
		select {
		case <-th.Done():
			return fmt.Errorf("the holder's term ended: %v", th.Err())
		case role := <-standbyWon:
			return fmt.Errorf("%s was elected", role)
		default:
			return nil
		}
	}

	// client-go: the holder first, then two followers.
	cl := uniqueLease("client-go-reqs", 0)
	cgSide := side{tool: "client-go"}
	var electors []*clientGo
	for i, role := range roles {
		p := newProc(b, srv)
		cgSide.procs = append(cgSide.procs, p)
		e := p.clientGo(b, cl, role)
		electors = append(electors, e)
		if i == 0 {
			receive(b, e.started, 2*leaseDuration, "the client-go holder to lead")
		}
	}
	for _, e := range electors[1:] {
		waitFor(b, 2*leaseDuration, "the client-go followers to see the holder", func() bool { return e.le.GetLeader() == roles[0] })
	}
	cgSide.check = func() error {
		if !electors[0].le.IsLeader() {
			return errors.New("the holder no longer leads")
		}
		for i, e := range electors[1:] {
			select {
			case <-e.started:
				return fmt.Errorf("%s was elected", roles[i+1])
			default:
			}
		}
		return nil
	}

	time.Sleep(warmUp) // left out of the count, not synchronisation
	sides := []side{batonSide, cgSide}
	snap := func() [][]map[string]int64 {
		out := make([][]map[string]int64, len(sides))
		for i, s := range sides {
			for _, p := range s.procs {
				out[i] = append(out[i], p.count.snapshot())
			}
		}
		return out
	}
	before, start := snap(), time.Now()
	for b.Loop() {
		time.Sleep(requestsWindow) // the measurement window itself
	}
	after, secs := snap(), time.Since(start).Seconds()

	var table, summary strings.Builder
	fmt.Fprintf(&table, "\n| tool | process | request type | requests | req/s |\n|---|---|---|---:|---:|\n")
	fmt.Fprintf(&summary, "\n| tool | lease | holder | standby-1 | standby-2 | per process |\n|---|---|---:|---:|---:|---:|\n")
	for i, s := range sides {
		if err := s.check(); err != nil {
			b.Errorf("%s: %v during the run", s.tool, err)
		}
		var sum int64
		rates := make([]string, len(s.procs))
		for j := range s.procs {
			var n int64
			for _, k := range slices.Sorted(maps.Keys(after[i][j])) {
				d := after[i][j][k] - before[i][j][k]
				if d == 0 {
					continue
				}
				n += d
				fmt.Fprintf(&table, "| %s | %s | %s | %d | %.3f |\n", s.tool, roles[j], k, d, float64(d)/secs)
			}
			sum += n
			rates[j] = fmt.Sprintf("%.3f", float64(n)/secs)
		}
		perProc := float64(sum) / secs / float64(len(s.procs))
		fmt.Fprintf(&summary, "| %s | %s | %s | %.3f |\n", s.tool, leaseDuration, strings.Join(rates, " | "), perProc)
		b.ReportMetric(perProc, s.tool+"-req/s/process")
	}
	b.Logf("requests per process per second over %.0f s, 1 holder + 2 standbys each, one kube-apiserver:%s%s", secs, summary.String(), table.String())
	if err := th.Resign(context.Background()); err != nil {
		b.Logf("baton holder's resign: %v", err)
	}
}
