package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/balance"
	"github.com/batonhq/baton/chaos/fenced"
	"github.com/batonhq/baton/internal/balancetest"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testserver"
)

// balanceSize is BenchmarkBalanceHundredInstances's size: 100 instances and
// 10,000 leases; with -short or at benchci's small size, 5 instances and
// 50 leases, the size at which CI runs it as a test that it still works;
// BATON_BENCH_BALANCE_SIZE
// ("20x2000": instances x leases) sets another.
func balanceSize(b *testing.B) (instances, leases int) {
	if s := os.Getenv("BATON_BENCH_BALANCE_SIZE"); s != "" {
		if _, err := fmt.Sscanf(s, "%dx%d", &instances, &leases); err != nil || instances < 2 || leases < 1 {
			b.Fatalf("BATON_BENCH_BALANCE_SIZE=%q: want INSTANCESxLEASES, such as 20x2000, with at least 2 instances and 1 lease", s)
		}
		return instances, leases
	}
	if testing.Short() || benchci.Small() {
		return 5, 50
	}
	return 100, 10000
}

// balanceTargets are the backends BenchmarkBalanceHundredInstances runs on,
// all of them by default (Kubernetes: BenchmarkKubernetesBalance in
// bench/kubernetes); BATON_BENCH_BALANCE_BACKENDS (a comma-separated list
// of their names) picks some. BATON_BENCH_BALANCE_LOG (debug, info, warn) prints the
// Groups' log lines at that level on stderr;
// BATON_BENCH_BALANCE_HEAPPROFILE (a path) writes a heap profile once the
// spread is first even.
var balanceTargets = map[string]func(*testing.B) target{
	"memory": memoryTarget, "etcd": etcdTarget, "zookeeper": zookeeperTarget, "consul": balanceConsulTarget,
	"postgres": balancePostgresTarget, "redis": redisTarget, "dynamodb": dynamoTarget, "raft": raftTarget,
}

// balanceTargetNames lists balanceTargets' names, for an error message.
func balanceTargetNames() string {
	names := make([]string, 0, len(balanceTargets))
	for name := range balanceTargets {
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// balanceConsulTarget is consulTarget on an agent that takes every
// instance's connections: the benchmark's instances all connect from
// 127.0.0.1, where in production each has its own host's agent, and each
// holds a blocking query per group of keys it watches, beyond the
// agent's default limit of 200 connections per client address.
func balanceConsulTarget(b *testing.B) target {
	return consulTargetOn(testserver.StartConsul(b, testserver.ConsulOptions{HTTPMaxConnsPerClient: 15000}))
}

// balancePostgresTarget is postgresTarget with one pooled connection per
// instance beside its LISTEN connection, so that 100 instances stay within
// the test server's max_connections (300); an instance's lease writes are
// one batched statement per renew interval, which one connection carries.
func balancePostgresTarget(b *testing.B) target {
	return postgresTargetWith(b, 1)
}

// BenchmarkBalanceHundredInstances: 10,000 leases spread by package balance
// over 100 instances, each a balance.Group on a backend client of its own
// (its own session), in this one process. Once the spread is even, the
// first instance leaves gracefully, then a new one joins. Reported per
// change: the time until every instance leads floor or ceil of the new
// share again (and keeps it for the hold time), the leases that changed
// hands (net), and every hand-over on the way, beside the fewest needed.
// Every lease's work writes to the chaos harness's fenced store when it
// starts and when it stops; the benchmark fails if any lease was held
// twice, and reports (late-writes) the overlaps of work that ran past its
// term's safe-until before its goroutine saw its context end (a paused
// holder, on a machine too busy to schedule it; the fence refused those
// writes). Also reported: the Leader requests per instance and refresh
// of the settled group (settled-reads-per-refresh), counted over five
// refreshes after the start: what a refresh costs once the spread is
// even; the campaigns for leases (member and load slots apart) from the
// start until the spread was even, per lease (start-campaigns-per-lease:
// an even spread needs a win and two or three standbys' per lease); and
// the process's goroutines and heap in use once the spread is
// first even, per instance. TTL 10 s; RefreshInterval 1 s, ShedAfter 3 s.
func BenchmarkBalanceHundredInstances(b *testing.B) {
	names := strings.Split(balanceTargetNames(), ", ")
	if s := os.Getenv("BATON_BENCH_BALANCE_BACKENDS"); s != "" {
		names = strings.Split(s, ",")
	}
	for _, name := range names {
		mk := balanceTargets[name]
		if mk == nil {
			b.Fatalf("BATON_BENCH_BALANCE_BACKENDS: no backend %q; the names are %s", name, balanceTargetNames())
		}
		tg := mk(b)
		b.Run(tg.name, func(b *testing.B) {
			for b.Loop() {
				balanceLeaveJoin(b, tg)
			}
		})
	}
}

func balanceLeaveJoin(b *testing.B, tg target) {
	n, leases := balanceSize(b)
	cfg := backend.Config{TTL: 10 * time.Second}
	bcfg := balance.Config{
		Group:           fmt.Sprintf("bench%d", time.Now().UnixNano()),
		MaxMembers:      2 * n,
		RefreshInterval: time.Second,
		ShedAfter:       3 * time.Second,
		RetryMax:        time.Second,
	}
	if lv := os.Getenv("BATON_BENCH_BALANCE_LOG"); lv != "" {
		// The Groups' log lines on stderr at that level (debug, info,
		// warn): where a run that does not even out is stuck.
		var level slog.Level
		if err := level.UnmarshalText([]byte(lv)); err != nil {
			b.Fatalf("BATON_BENCH_BALANCE_LOG=%q: want debug, info, warn or error", lv)
		}
		bcfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	hold := 3 * bcfg.RefreshInterval
	timeout := 10 * time.Minute

	var reads atomic.Int64     // Leader requests of every instance
	var campaigns atomic.Int64 // campaigns for leases of every instance
	fence := fenced.New()
	w := balancetest.NewWorld(b, leases, nil)
	w.Fence = fence
	start := func(id string) *balancetest.Proc {
		p := tg.new(b, cfg)
		c := bcfg
		c.Candidate = baton.Candidate{ID: id}
		g, err := balance.New(&leaderCounter{p.backend, &reads, &campaigns, c.Group}, c)
		if err != nil {
			b.Fatal(err)
		}
		return w.Start(g, p.kill)
	}
	cpu0, t0 := cpuTime(), time.Now()
	var procs []*balancetest.Proc
	for i := range n {
		procs = append(procs, start(fmt.Sprintf("i%03d", i)))
	}
	settle := w.AwaitSteadyFor(procs, leases/n, (leases+n-1)/n, hold, timeout)
	startCampaigns := float64(campaigns.Load()) / float64(leases)
	// What the settled group keeps: goroutines and heap of the process, all
	// instances, per instance.
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	goroutines, heap := runtime.NumGoroutine(), ms.HeapInuse
	if path := os.Getenv("BATON_BENCH_BALANCE_HEAPPROFILE"); path != "" {
		writeHeapProfile(b, path)
	}
	r0, w0 := reads.Load(), time.Now()
	time.Sleep(5 * bcfg.RefreshInterval) // the window the rate is measured over
	settledReads := float64(reads.Load()-r0) / float64(n) / (time.Since(w0).Seconds() / bcfg.RefreshInterval.Seconds())
	leave, join, live := w.LeaveJoin(procs, start, hold, timeout)
	cpu, wall := cpuTime()-cpu0, time.Since(t0)
	b.Logf("%s, %d instances x %d leases: spread even after %s; leave: %v; join: %v", tg.name, n, leases, settle.Round(10*time.Millisecond), leave, join)

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, p := range live {
		p.Stop()
	}
	for _, p := range live {
		select {
		case err := <-p.Done:
			p.Done <- err // for the clean-up
		case <-ctx.Done():
			b.Fatalf("%s: Run did not return", p.ID)
		}
	}
	r := fence.Check()
	b.Logf("fenced check: %v", r)
	if !r.OK() {
		b.Fatalf("a lease was held twice: %v", r)
	}
	w.CheckNoOverlap()
	b.ReportMetric(settle.Seconds(), "start-even-s")
	b.ReportMetric(settledReads, "settled-reads-per-refresh")
	b.ReportMetric(startCampaigns, "start-campaigns-per-lease")
	b.ReportMetric(leave.Took.Seconds(), "leave-even-s")
	b.ReportMetric(float64(leave.Moved), "leave-moved")
	b.ReportMetric(float64(leave.HandOvers), "leave-handovers")
	b.ReportMetric(float64(leave.Needed), "leave-needed")
	b.ReportMetric(join.Took.Seconds(), "join-even-s")
	b.ReportMetric(float64(join.Moved), "join-moved")
	b.ReportMetric(float64(join.HandOvers), "join-handovers")
	b.ReportMetric(float64(join.Needed), "join-needed")
	b.ReportMetric(float64(r.Overlaps+r.Violations+r.Regressions), "held-twice")
	b.ReportMetric(float64(r.Late), "late-writes")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
	b.ReportMetric(float64(goroutines)/float64(n), "settled-goroutines-per-instance")
	b.ReportMetric(float64(heap)/float64(n)/(1<<20), "settled-heap-MB-per-instance")
}

// leaderCounter is a Backend that counts its Leader requests, and its
// campaigns for leases other than the group's member and load slots.
type leaderCounter struct {
	baton.Backend
	n, campaigns *atomic.Int64
	group        string
}

func (c *leaderCounter) Campaign(ctx context.Context, name string, cand baton.Candidate) (baton.Term, error) {
	if !strings.HasPrefix(name, c.group+".member-") && !strings.HasPrefix(name, c.group+".load-") {
		c.campaigns.Add(1)
	}
	return c.Backend.Campaign(ctx, name, cand)
}

func (c *leaderCounter) Leader(ctx context.Context, name string) (baton.Record, error) {
	c.n.Add(1)
	return c.Backend.Leader(ctx, name)
}

var _ = benchci.Register(BenchmarkBalanceHundredInstances, "start-even-s>0", "leave-even-s>0", "join-even-s>0",
	"leave-needed>0", "join-needed>0", "settled-reads-per-refresh>0", "start-campaigns-per-lease>0", "held-twice>=0", "held-twice<=0", "cpu-%>=0",
	"settled-goroutines-per-instance>0", "settled-heap-MB-per-instance>0")

// writeHeapProfile writes the heap profile to path: what the settled group
// keeps, where -memprofile would show the heap after the instances stopped.
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
