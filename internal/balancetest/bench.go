package balancetest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/balance"
	"github.com/batonhq/baton/internal/testkit"
)

// Bench is one run of the balance benchmark on one backend: Instances
// balance.Groups, each on a Backend of its own, spreading Leases leases.
type Bench struct {
	Instances, Leases int
	// New returns one instance's Backend with cfg, and a func that cuts
	// it off without releasing anything, as kill -9 would.
	New func(b *testing.B, cfg backend.Config) (be baton.Backend, kill func())
	// Fence is the store every lease's work writes to (the chaos
	// harness's fenced.Leases), checked once every instance has stopped.
	Fence CheckedFence
}

// CheckedFence is a Fence that checks what was written to it. Summary
// returns what it found (logged), the times a lease was held twice
// (fencing violations, token regressions and overlaps: the run fails if
// any), and the writes of work that ran past its term's safe-until, which
// the fence refused.
type CheckedFence interface {
	Fence
	Summary() (summary string, heldTwice, late int)
}

// Run starts the instances together, waits until the spread is even, then
// one instance leaves gracefully and a new one joins, waiting for an even
// spread after each, and reports per change: the time until every
// instance leads floor or ceil of the new share again (and keeps it for
// three refreshes), the leases that changed hands (net), and every
// hand-over on the way, beside the fewest needed. It fails if a lease was
// held twice. Also reported: the lease holders read per instance and
// refresh once the spread is even (settled-reads-per-refresh, counted over
// five refreshes) and the read requests that took (one per holder, or one
// per batch on a baton.LeadersReader: settled-requests-per-refresh), the
// read requests per instance from the start until even
// (start-read-requests-per-instance), the campaigns for leases (member and load slots apart) per
// lease from the start until even (start-campaigns-per-lease), the
// process's CPU over the run, and its goroutines and heap in use per
// instance once even. TTL 10 s; RefreshInterval 1 s, ShedAfter 3 s.
//
// BATON_BENCH_BALANCE_LOG (debug, info, warn) prints the Groups' log lines
// at that level on stderr; BATON_BENCH_BALANCE_HEAPPROFILE (a path) writes
// a heap profile once the spread is first even.
func (bc Bench) Run(b *testing.B, name string) {
	n, leases := bc.Instances, bc.Leases
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

	var reads atomic.Int64     // lease holders read by every instance
	var requests atomic.Int64  // read requests of every instance
	var campaigns atomic.Int64 // campaigns for leases of every instance
	w := NewWorld(b, leases, nil)
	w.Fence = bc.Fence
	start := func(id string) *Proc {
		be, kill := bc.New(b, cfg)
		c := bcfg
		c.Candidate = baton.Candidate{ID: id}
		g, err := balance.New(countLeaders(be, &reads, &requests, &campaigns, c.Group), c)
		if err != nil {
			b.Fatal(err)
		}
		return w.Start(g, kill)
	}
	cpu0, t0 := testkit.CPUTime(), time.Now()
	var procs []*Proc
	for i := range n {
		procs = append(procs, start(fmt.Sprintf("i%03d", i)))
	}
	settle := w.AwaitSteadyFor(procs, leases/n, (leases+n-1)/n, hold, timeout)
	startCampaigns := float64(campaigns.Load()) / float64(leases)
	startRequests := float64(requests.Load()) / float64(n)
	// What the settled group keeps: goroutines and heap of the process, all
	// instances, per instance.
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	goroutines, heap := runtime.NumGoroutine(), ms.HeapInuse
	if path := os.Getenv("BATON_BENCH_BALANCE_HEAPPROFILE"); path != "" {
		testkit.WriteHeapProfile(b, path)
	}
	r0, q0, w0 := reads.Load(), requests.Load(), time.Now()
	time.Sleep(5 * bcfg.RefreshInterval) // the window the rate is measured over
	refreshes := float64(n) * time.Since(w0).Seconds() / bcfg.RefreshInterval.Seconds()
	settledReads := float64(reads.Load()-r0) / refreshes
	settledRequests := float64(requests.Load()-q0) / refreshes
	leave, join, live := w.LeaveJoin(procs, start, hold, timeout)
	cpu, wall := testkit.CPUTime()-cpu0, time.Since(t0)
	b.Logf("%s, %d instances x %d leases: spread even after %s; leave: %v; join: %v", name, n, leases, settle.Round(10*time.Millisecond), leave, join)

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
	summary, heldTwice, late := bc.Fence.Summary()
	b.Logf("fenced check: %s", summary)
	if heldTwice > 0 {
		b.Fatalf("a lease was held twice: %s", summary)
	}
	w.CheckNoOverlap()
	b.ReportMetric(settle.Seconds(), "start-even-s")
	b.ReportMetric(settledReads, "settled-reads-per-refresh")
	b.ReportMetric(settledRequests, "settled-requests-per-refresh")
	b.ReportMetric(startRequests, "start-read-requests-per-instance")
	b.ReportMetric(startCampaigns, "start-campaigns-per-lease")
	b.ReportMetric(leave.Took.Seconds(), "leave-even-s")
	b.ReportMetric(float64(leave.Moved), "leave-moved")
	b.ReportMetric(float64(leave.HandOvers), "leave-handovers")
	b.ReportMetric(float64(leave.Needed), "leave-needed")
	b.ReportMetric(join.Took.Seconds(), "join-even-s")
	b.ReportMetric(float64(join.Moved), "join-moved")
	b.ReportMetric(float64(join.HandOvers), "join-handovers")
	b.ReportMetric(float64(join.Needed), "join-needed")
	b.ReportMetric(float64(heldTwice), "held-twice")
	b.ReportMetric(float64(late), "late-writes")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
	b.ReportMetric(float64(goroutines)/float64(n), "settled-goroutines-per-instance")
	b.ReportMetric(float64(heap)/float64(n)/(1<<20), "settled-heap-MB-per-instance")
}

// BenchMetrics are the metrics Bench.Run reports with the bounds a run of
// any size meets, for benchci.Register.
var BenchMetrics = []string{"start-even-s>0", "leave-even-s>0", "join-even-s>0",
	"leave-needed>0", "join-needed>0", "settled-reads-per-refresh>0", "settled-requests-per-refresh>0", "start-read-requests-per-instance>0", "start-campaigns-per-lease>0", "held-twice>=0", "held-twice<=0", "cpu-%>=0",
	"settled-goroutines-per-instance>0", "settled-heap-MB-per-instance>0"}

// BenchSize is the benchmark's size: 100 instances and 10,000 leases; with
// -short or small (benchci's small size), 5 instances and 50 leases, the
// size at which CI runs it as a test that it still works;
// BATON_BENCH_BALANCE_SIZE ("20x2000": instances x leases) sets another.
func BenchSize(b *testing.B, small bool) (instances, leases int) {
	if s := os.Getenv("BATON_BENCH_BALANCE_SIZE"); s != "" {
		if _, err := fmt.Sscanf(s, "%dx%d", &instances, &leases); err != nil || instances < 2 || leases < 1 {
			b.Fatalf("BATON_BENCH_BALANCE_SIZE=%q: want INSTANCESxLEASES, such as 20x2000, with at least 2 instances and 1 lease", s)
		}
		return instances, leases
	}
	if testing.Short() || small {
		return 5, 50
	}
	return 100, 10000
}

// leaderCounter is a Backend that counts the lease holders it reads and
// its read requests, and its campaigns for leases other than the group's
// member and load slots.
type leaderCounter struct {
	baton.Backend
	reads, requests, campaigns *atomic.Int64
	group                      string
}

// batchLeaderCounter is a leaderCounter over a baton.LeadersReader, which
// it stays.
type batchLeaderCounter struct {
	*leaderCounter
	lr baton.LeadersReader
}

// countLeaders returns be counting into reads, requests and campaigns; a
// baton.LeadersReader stays one.
func countLeaders(be baton.Backend, reads, requests, campaigns *atomic.Int64, group string) baton.Backend {
	c := &leaderCounter{be, reads, requests, campaigns, group}
	if lr, ok := be.(baton.LeadersReader); ok {
		return &batchLeaderCounter{c, lr}
	}
	return c
}

func (c *leaderCounter) Campaign(ctx context.Context, name string, cand baton.Candidate) (baton.Term, error) {
	if !strings.HasPrefix(name, c.group+".member-") && !strings.HasPrefix(name, c.group+".load-") {
		c.campaigns.Add(1)
	}
	return c.Backend.Campaign(ctx, name, cand)
}

func (c *leaderCounter) Leader(ctx context.Context, name string) (baton.Record, error) {
	c.reads.Add(1)
	c.requests.Add(1)
	return c.Backend.Leader(ctx, name)
}

func (c *batchLeaderCounter) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	c.reads.Add(int64(len(names)))
	c.requests.Add(1)
	return c.lr.Leaders(ctx, names)
}
