package kubernetes

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
)

// BenchmarkKubernetesTenThousandCandidates is bench's
// BenchmarkTenThousandCandidates on one Lease of kube-apiserver: many
// candidates, spread over processes, each process one baton Backend (its
// own client, counted, behind a proxy of its own) campaigning with its
// share of the candidates. The processes are simulated in the benchmark's
// process, as everywhere in this package; a crash cuts the holder's proxy
// (it stops writing and never releases). Each iteration makes 10
// graceful hand-overs (the holder resigns and campaigns again) and one
// crash failover (the crashed process is replaced). Reported:
// handover-p50-ms and -p99-ms, failover-max-ms beside bound-ms (TTL + one
// renew interval), req/s/proc of a waiting process in the steady state,
// and req/handover: the requests of all processes during a hand-over and
// the second after it, beyond their steady rate. Run at 10,000 by hand:
//
//	go test -run '^$' -bench KubernetesTenThousandCandidates -benchtime 1x -timeout 60m -v ./bench/kubernetes
func BenchmarkKubernetesTenThousandCandidates(b *testing.B) {
	procs, per, ttl := candidatesSize(b)
	srv := apiServer(b)
	lease := fmt.Sprintf("candidates-%d", time.Now().UnixNano())
	type kproc struct {
		p    *proc
		be   *kubernetes.Backend
		stop context.CancelFunc
		wg   sync.WaitGroup
		dead bool
	}
	type won struct {
		proc int
		id   string
		at   time.Time
		term baton.Term
	}
	wins := make(chan won, 16)
	var ps []*kproc
	start := func() {
		i := len(ps)
		kp := &kproc{p: newProc(b, srv)}
		be, err := kubernetes.New(kp.p.cs, kubernetes.Options{
			RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: ttl}},
			Namespace:     namespace,
		})
		if err != nil {
			b.Fatal(err)
		}
		kp.be = be
		ctx, cancel := context.WithCancel(context.Background())
		kp.stop = cancel
		for c := range per {
			id := fmt.Sprintf("p%d-c%d", i, c)
			kp.wg.Go(func() {
				for ctx.Err() == nil {
					t, err := be.Campaign(ctx, lease, baton.Candidate{ID: id})
					if err != nil {
						select {
						case <-ctx.Done():
						case <-time.After(100 * time.Millisecond): // a retry's pace
						}
						continue
					}
					wins <- won{i, id, time.Now(), t}
					select {
					case <-t.Done():
					case <-ctx.Done():
						return
					}
				}
			})
		}
		b.Cleanup(func() {
			cancel()
			kp.wg.Wait()
			cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer ccancel()
			_ = be.Close(cctx)
		})
		ps = append(ps, kp)
	}
	next := func(prevToken uint64) won {
		select {
		case w := <-wins:
			if w.term.Token() <= prevToken {
				b.Fatalf("%s won with token %d after %d: tokens must increase", w.id, w.term.Token(), prevToken)
			}
			return w
		case <-time.After(3 * time.Minute):
			b.Fatal("no candidate won within 3 minutes")
		}
		return won{}
	}
	snapshot := func() []int64 {
		s := make([]int64, len(ps))
		for i, kp := range ps {
			for _, v := range kp.p.count.snapshot() {
				s[i] += v
			}
		}
		return s
	}
	for range procs {
		start()
	}
	holder := next(0)
	time.Sleep(ttl) // warm-up: the campaigns' first reads and watches
	window := 2 * ttl
	s0 := snapshot()
	time.Sleep(window) // the measurement window itself
	s1 := snapshot()
	rates := make([]float64, len(s0))
	var sum float64
	for i := range s0 {
		rates[i] = float64(s1[i]-s0[i]) / window.Seconds()
		sum += rates[i]
	}
	perProc := sum / float64(len(s0))

	var handovers, failovers []time.Duration
	var extra []float64
	for b.Loop() {
		for range 10 {
			before := snapshot()
			at := time.Now()
			if err := holder.term.Resign(context.Background()); err != nil {
				b.Fatal(err)
			}
			w := next(holder.term.Token())
			handovers = append(handovers, w.at.Sub(at))
			// Counting the hand-over's requests, not synchronisation; a
			// second also lets client-go's client-side rate limiter (5
			// requests a second, bursts of 10, by default) refill, as
			// between hand-overs that are not back to back.
			time.Sleep(time.Second)
			after, el := snapshot(), time.Since(at)
			x := 0.0
			for i := range before {
				if !ps[i].dead {
					x += float64(after[i]-before[i]) - rates[i]*el.Seconds()
				}
			}
			extra = append(extra, x)
			holder = w
		}
		dead := ps[holder.proc]
		at := time.Now()
		dead.p.crash()
		dead.dead = true
		dead.stop()
		w := next(holder.term.Token())
		if w.proc == holder.proc {
			b.Fatalf("%s won in the crashed process", w.id)
		}
		failovers = append(failovers, w.at.Sub(at))
		holder = w
		start()
		rates = append(rates, perProc)
	}
	sort.Slice(handovers, func(i, j int) bool { return handovers[i] < handovers[j] })
	b.ReportMetric(perProc, "req/s/proc")
	b.ReportMetric(perProc/float64(per), "req/s/candidate")
	b.ReportMetric(float64(handovers[len(handovers)/2].Microseconds())/1000, "handover-p50-ms")
	b.ReportMetric(float64(handovers[(len(handovers)*99+99)/100-1].Microseconds())/1000, "handover-p99-ms")
	report(b, failovers, "failover")
	b.ReportMetric(float64((ttl + ttl/3).Milliseconds()), "bound-ms")
	var xs float64
	for _, x := range extra {
		xs += x
	}
	b.ReportMetric(xs/float64(len(extra)), "req/handover")
}

// candidatesSize is bench's: 10 processes × 1,000 candidates,
// BATON_BENCH_CANDIDATES=PROCSxPER for another size, 2 × 10 with -short or
// BATON_BENCH_SMALL=1 (CI's check that it still works); TTL 10 s from
// 1,000 candidates up, 3 s below.
func candidatesSize(tb testing.TB) (procs, per int, ttl time.Duration) {
	procs, per = 10, 1000
	if s := os.Getenv("BATON_BENCH_CANDIDATES"); s != "" {
		p, n, ok := strings.Cut(s, "x")
		var err1, err2 error
		procs, err1 = strconv.Atoi(p)
		per, err2 = strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil || procs < 2 || per < 1 {
			tb.Fatalf("BATON_BENCH_CANDIDATES=%q: want PROCSxPER with at least 2 processes, e.g. 10x1000", s)
		}
	} else if testing.Short() || os.Getenv("BATON_BENCH_SMALL") == "1" {
		procs, per = 2, 10
	}
	ttl = 3 * time.Second
	if procs*per >= 1000 {
		ttl = backend.DefaultTTL
	}
	return procs, per, ttl
}
