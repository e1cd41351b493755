package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
)

// process is one simulated process of a backend under benchmark.
type process struct {
	backend baton.Backend
	kill    func() // vanish without releasing, like kill -9
}

// target is a backend under benchmark. requests counts the backend requests
// made by all processes created so far.
type target struct {
	name     string
	new      func(b *testing.B, cfg backend.Config) *process
	requests func() int64
}

// namedTarget is a target not yet started: mk starts its servers, and is
// called only once a sub-benchmark of that name runs, so that a benchmark
// filtered to one backend starts no other's, and no other backend's
// servers or in-process members add to a figure measured in this process.
type namedTarget struct {
	name string
	mk   func(b *testing.B) target
}

// targets lists the backends; backends with a server add themselves in
// their own file.
var (
	targetsMu sync.Mutex
	targets   = []namedTarget{{"memory", memoryTarget}}
)

// countingStore counts the requests a backend.RecordBackend makes, as a server would.
type countingStore struct {
	backend.RecordStore
	n *atomic.Int64
}

func (c countingStore) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	c.n.Add(1)
	return c.RecordStore.Get(ctx, name)
}

func (c countingStore) CompareAndSwap(ctx context.Context, name string, v uint64, r backend.LeaseRecord) (uint64, error) {
	c.n.Add(1)
	return c.RecordStore.CompareAndSwap(ctx, name, v, r)
}

// GetMany is passed through, one request, so that the store reads many
// leases at once as the real memory backend does.
func (c countingStore) GetMany(ctx context.Context, names []string) ([]backend.LeaseRecord, []uint64, error) {
	c.n.Add(1)
	return c.RecordStore.(backend.RecordMultiGetter).GetMany(ctx, names)
}

// Notify is passed through so waiters wake on release as they would on the
// real memory backend.
func (c countingStore) Notify(ctx context.Context, name string) (<-chan struct{}, error) {
	return c.RecordStore.(backend.RecordNotifier).Notify(ctx, name)
}

func memoryTarget(b *testing.B) target {
	return memoryTargetWith("memory", func(c countingStore) backend.RecordStore { return c })
}

// memoryTargetWith is a memory store target whose processes each reach
// the store through wrap (over the counting of requests).
func memoryTargetWith(name string, wrap func(countingStore) backend.RecordStore) target {
	store := memory.NewStore()
	var n atomic.Int64
	return target{
		name: name,
		new: func(b *testing.B, cfg backend.Config) *process {
			conn := store.Connect()
			be, err := backend.NewRecordBackend(wrap(countingStore{conn, &n}), backend.RecordOptions{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = be.Close(context.Background()) })
			return &process{backend: be, kill: conn.Disconnect}
		},
		requests: n.Load,
	}
}

func forEachTarget(b *testing.B, fn func(b *testing.B, tg target)) {
	targetsMu.Lock()
	list := append([]namedTarget(nil), targets...)
	targetsMu.Unlock()
	for _, nt := range list {
		b.Run(nt.name, func(b *testing.B) { fn(b, nt.mk(b)) })
	}
}

var benchCfg = backend.Config{TTL: time.Second}

func mustCampaign(b *testing.B, p *process, lease, id string) baton.Term {
	b.Helper()
	return testkit.Campaign(b, p.backend, lease, id)
}

// holdMany wins n leases named prefix-00000 on, as candidate "many" of
// be, 64 campaigns at a time.
func holdMany(b *testing.B, be baton.Backend, prefix string, n int) []baton.Term {
	b.Helper()
	terms := make([]baton.Term, n)
	// 64 campaigns at a time, by 64 workers rather than a goroutine per
	// lease: the runtime keeps every goroutine's descriptor it ever made
	// (about 0.5 kB), which the heap figure would count.
	var wg sync.WaitGroup
	var next atomic.Int64
	for range min(n, 64) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				terms[i] = testkit.Campaign(b, be, fmt.Sprintf("%s-%05d", prefix, i), "many")
			}
		})
	}
	wg.Wait()
	return terms
}

// handOver measures, per iteration, the time from the holder's end (killed
// or resigned) to a waiting contender's acquisition.
func handOver(b *testing.B, tg target, crash bool) {
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		lease := fmt.Sprintf("handover-%v-%d-%d", crash, time.Now().UnixNano(), i)
		holder, waiter := tg.new(b, benchCfg), tg.new(b, benchCfg)
		th := mustCampaign(b, holder, lease, "holder")
		// In the background, so a failed campaign fails the benchmark
		// from its own goroutine rather than leave it waiting.
		got := testkit.CampaignAsync(b, waiter.backend, lease, "waiter")
		// Let the waiter start waiting and the holder renew once.
		first := th.SafeUntil()
		for !th.SafeUntil().After(first) {
			time.Sleep(5 * time.Millisecond)
		}
		start := time.Now()
		if crash {
			holder.kill()
		} else {
			_ = th.Resign(context.Background())
		}
		samples = append(samples, testkit.WaitTerm(b, got, testkit.CampaignTimeout).At.Sub(start))
	}
	report(b, samples, "failover")
}

func report(b *testing.B, samples []time.Duration, what string) {
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	med := samples[len(samples)/2]
	b.ReportMetric(float64(med.Microseconds())/1000, what+"-median-ms")
	b.ReportMetric(float64(samples[len(samples)-1].Microseconds())/1000, what+"-max-ms")
}

// BenchmarkCrashFailover: the holder vanishes (kill -9); time until a waiting
// contender leads. TTL 1 s.
func BenchmarkCrashFailover(b *testing.B) {
	forEachTarget(b, func(b *testing.B, tg target) { handOver(b, tg, true) })
}

// BenchmarkGracefulHandOver: the holder resigns; time until a waiting
// contender leads. TTL 1 s.
func BenchmarkGracefulHandOver(b *testing.B) {
	forEachTarget(b, func(b *testing.B, tg target) { handOver(b, tg, false) })
}

// BenchmarkSteadyState: backend requests per second made by one process
// holding one lease (TTL 10 s) with one standby process waiting, from a
// second after the standby began to wait.
func BenchmarkSteadyState(b *testing.B) {
	forEachTarget(b, steadyRequests)
}

// steadyRequests is BenchmarkSteadyState on one target.
func steadyRequests(b *testing.B, tg target) {
	// baton's default (raft's is 2 s); at the small size, a TTL whose
	// renewals fall in the short window.
	cfg := backend.Config{TTL: benchci.Size(10*time.Second, time.Second)}
	lease := fmt.Sprintf("steady-%d", time.Now().UnixNano())
	holder := tg.new(b, cfg)
	th := mustCampaign(b, holder, lease, "holder")
	waiter := tg.new(b, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = waiter.backend.Campaign(ctx, lease, baton.Candidate{ID: "waiter"}) })
	// The waiter's campaign (a few milliseconds) is left out of the
	// measurement: a warm-up, not synchronisation.
	time.Sleep(benchci.Size(time.Second, 200*time.Millisecond))
	window := benchci.Size(10*time.Second, time.Second)
	var rate float64
	for b.Loop() {
		before, start := tg.requests(), time.Now()
		time.Sleep(window) // the measurement window itself, not synchronisation
		rate = float64(tg.requests()-before) / time.Since(start).Seconds() / 2
	}
	b.ReportMetric(rate, "req/s/process")
	cancel()
	wg.Wait()
	_ = th.Resign(context.Background())
}

// BenchmarkTenThousandLeases: CPU and heap for one process holding 10,000
// leases (TTL 10 s) through one backend: cpu-% over a window that starts
// as the last lease is won, settled-cpu-% over the window after it.
func BenchmarkTenThousandLeases(b *testing.B) {
	forEachTarget(b, func(b *testing.B, tg target) {
		n := benchci.Size(10000, 10)
		for b.Loop() {
			runtime.GC()
			var m0 runtime.MemStats
			runtime.ReadMemStats(&m0)
			// What the process spends before this backend exists (other
			// targets' servers started in it, such as raft's voters): part
			// of cpu-%, not this backend's cost.
			idle0, idleStart := testkit.CPUTime(), time.Now()
			time.Sleep(benchci.Size(3*time.Second, 500*time.Millisecond))
			b.ReportMetric(100*(testkit.CPUTime()-idle0).Seconds()/time.Since(idleStart).Seconds(), "idle-cpu-%")
			p := tg.new(b, backend.Config{TTL: benchci.Size(10*time.Second, 2*time.Second)})
			terms := holdMany(b, p.backend, fmt.Sprintf("many-%d", time.Now().UnixNano()), n)
			// Hold through several renewals and measure the process's CPU.
			window := benchci.Size(10*time.Second, 2*time.Second)
			stopProfile := startWindowProfile(b)
			cpu0, start, req0 := testkit.CPUTime(), time.Now(), tg.requests()
			time.Sleep(window)
			cpu := testkit.CPUTime() - cpu0
			wall := time.Since(start)
			stopProfile()
			// One renewal per process per renew interval, not one per lease.
			b.ReportMetric(float64(tg.requests()-req0)/wall.Seconds(), "req/s")
			runtime.GC()
			var m1 runtime.MemStats
			runtime.ReadMemStats(&m1)
			b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
			b.ReportMetric(float64(int64(m1.HeapInuse)-int64(m0.HeapInuse))/(1<<20), "heap-MB")
			b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
			// A second window, once the first has let the acquisitions'
			// aftermath (watches catching up with the last changes) pass:
			// what holding alone costs.
			cpu0, start = testkit.CPUTime(), time.Now()
			time.Sleep(window)
			b.ReportMetric(100*(testkit.CPUTime()-cpu0).Seconds()/time.Since(start).Seconds(), "settled-cpu-%")
			for _, t := range terms {
				if t.Err() != nil {
					b.Fatalf("lease %s ended while held: %v", t.Lease(), t.Err())
				}
			}
			var wg sync.WaitGroup
			sem := make(chan struct{}, 64)
			for _, t := range terms {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					_ = t.Resign(context.Background())
				})
			}
			wg.Wait()
		}
	})
}

// startWindowProfile starts, when BATON_BENCH_TENK_CPUPROFILE names a
// file, a CPU profile of BenchmarkTenThousandLeases's first window alone
// (-cpuprofile would hold the acquisitions too), and returns what ends it;
// that also writes, when BATON_BENCH_TENK_HEAPPROFILE names a file, the
// heap as the window ends. Run one target at a time with them.
func startWindowProfile(b *testing.B) (stop func()) {
	cpu, heap := os.Getenv("BATON_BENCH_TENK_CPUPROFILE"), os.Getenv("BATON_BENCH_TENK_HEAPPROFILE")
	stopCPU := func() {}
	if cpu != "" {
		f, err := os.Create(cpu)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		stopCPU = func() { pprof.StopCPUProfile(); _ = f.Close() }
	}
	return func() {
		stopCPU()
		if heap != "" {
			runtime.GC()
			testkit.WriteHeapProfile(b, heap)
		}
	}
}
