package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
)

// The benchmarks in this file report the speed figures of the scenarios
// the conformance suite (batontest) checks for safety: the suite asserts
// ordering and documented guarantees, with only hang bounds on how long
// things take; how long they take is measured here. The hand-over after a
// resign and the crash failover are BenchmarkGracefulHandOver and
// BenchmarkCrashFailover. TTL 1 s throughout.

// BenchmarkCutOffHolderStops: a holder that has renewed once with a
// contender waiting is cut off (its process's kill: etcd, ZooKeeper and
// Consul cut its proxy and leave the client running; raft kills its
// member). stop is the time from the cut to the end of the holder's term
// (batontest's CutOffHolderStopsBySafeUntil checks that it ends by its
// safe-until); gap is the time from that end to the contender's
// acquisition.
func BenchmarkCutOffHolderStops(b *testing.B) {
	forEachTarget(b, func(b *testing.B, tg target) {
		var stops, gaps []time.Duration
		for i := 0; b.Loop(); i++ {
			lease := fmt.Sprintf("cutoff-%d-%d", time.Now().UnixNano(), i)
			holder, waiter := tg.new(b, benchCfg), tg.new(b, benchCfg)
			th := mustCampaign(b, holder, lease, "holder")
			got := testkit.CampaignAsync(b, waiter.backend, lease, "waiter")
			waitRenewed(th)
			cut := time.Now()
			holder.kill()
			<-th.Done()
			ended := time.Now()
			acquired := testkit.WaitTerm(b, got, testkit.CampaignTimeout).At
			stops = append(stops, ended.Sub(cut))
			gaps = append(gaps, acquired.Sub(ended))
		}
		report(b, stops, "stop")
		report(b, gaps, "gap")
	})
}

// BenchmarkCampaignAfterCancelledWaiter: a holds the lease, b's campaign is
// cancelled after 300 ms of waiting, a resigns, and c campaigns; the time
// from a's resignation to c's acquisition (batontest's
// CancelledCampaignLeavesNoTrace checks that c wins and that nobody leads
// in between).
func BenchmarkCampaignAfterCancelledWaiter(b *testing.B) {
	forEachTarget(b, func(b *testing.B, tg target) {
		var samples []time.Duration
		for i := 0; b.Loop(); i++ {
			lease := fmt.Sprintf("cancelled-%d-%d", time.Now().UnixNano(), i)
			pa, pb, pc := tg.new(b, benchCfg), tg.new(b, benchCfg), tg.new(b, benchCfg)
			ta := mustCampaign(b, pa, lease, "a")
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			_, err := pb.backend.Campaign(ctx, lease, baton.Candidate{ID: "b"})
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				b.Fatalf("b's cancelled campaign: %v, want context.DeadlineExceeded", err)
			}
			start := time.Now()
			if err := ta.Resign(context.Background()); err != nil {
				b.Fatalf("a's resign: %v", err)
			}
			tc := mustCampaign(b, pc, lease, "c")
			samples = append(samples, time.Since(start))
			_ = tc.Resign(context.Background())
		}
		report(b, samples, "campaign")
	})
}

// BenchmarkElectorTerms: three processes with an Elector each on one lease,
// each term returning at once, until 30 terms were held; the time per term
// (batontest's TokensIncreaseOverHandOvers checks 100 such terms for
// overlap and rising tokens).
func BenchmarkElectorTerms(b *testing.B) {
	forEachTarget(b, func(b *testing.B, tg target) {
		terms := int32(benchci.Size(30, 5))
		var samples []time.Duration
		for i := 0; b.Loop(); i++ {
			lease := fmt.Sprintf("electors-%d-%d", time.Now().UnixNano(), i)
			var electors []*baton.Elector
			for j := range 3 {
				e, err := baton.NewElector(tg.new(b, benchCfg).backend, baton.ElectorConfig{
					Lease: lease, Candidate: baton.Candidate{ID: fmt.Sprintf("p%d", j)},
				})
				if err != nil {
					b.Fatal(err)
				}
				electors = append(electors, e)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			var (
				count atomic.Int32
				wg    sync.WaitGroup
			)
			start := time.Now()
			for _, e := range electors {
				wg.Go(func() {
					_ = e.Run(ctx, func(context.Context, baton.Term) error {
						if count.Add(1) >= terms {
							cancel()
						}
						return nil
					})
				})
			}
			wg.Wait()
			cancel()
			if n := count.Load(); n < terms {
				b.Fatalf("only %d of %d terms were held", n, terms)
			}
			samples = append(samples, time.Since(start)/time.Duration(terms))
		}
		report(b, samples, "term")
	})
}

// waitRenewed returns once term's safe-until has moved (or the term
// ended), so that what follows starts after at least one renewal with the
// contender waiting.
func waitRenewed(term baton.Term) {
	first := term.SafeUntil()
	for !term.SafeUntil().After(first) {
		select {
		case <-term.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}
