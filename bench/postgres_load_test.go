package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// loadWindow is how long the load benchmarks count statements and CPU:
// one TTL of baton's default (10 s), so that every waiter's TTL-due read
// falls in it once.
var loadWindow = benchci.Size(10*time.Second, time.Second)

// loadTTL is baton's default TTL, used by the load benchmarks.
const loadTTL = 10 * time.Second

// serverCPU returns a function that reads the CPU time used so far by the
// PostgreSQL cluster that pool talks to: its postmaster, the children it
// reaped, and its live children (backends, checkpointer, ...). It reads
// /proc, so the cluster must run on this host.
func serverCPU(b *testing.B, pool *pgxpool.Pool) func() time.Duration {
	var backendPID int
	if err := pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backendPID); err != nil {
		b.Fatal(err)
	}
	st, err := procStat(backendPID)
	if err != nil {
		b.Fatal(err)
	}
	postmaster := st.ppid
	return func() time.Duration {
		pm, err := procStat(postmaster)
		if err != nil {
			b.Fatal(err)
		}
		total := pm.self + pm.children
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			pid, _ := strconv.Atoi(filepath.Base(d))
			if s, err := procStat(pid); err == nil && s.ppid == postmaster {
				total += s.self
			}
		}
		return total
	}
}

// stat is what serverCPU reads of /proc/PID/stat.
type stat struct {
	ppid     int
	self     time.Duration // utime + stime
	children time.Duration // cutime + cstime: reaped children
}

// procStat reads /proc/PID/stat; CPU times are in clock ticks of 10 ms
// (USER_HZ is 100 on Linux).
func procStat(pid int) (stat, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, err
	}
	// The command name is in parentheses and may hold spaces: the fields
	// after it start at the last ')'.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	tick := 10 * time.Millisecond
	return stat{
		ppid:     int(n(1)),
		self:     time.Duration(n(11)+n(12)) * tick,
		children: time.Duration(n(13)+n(14)) * tick,
	}, nil
}

// loadMeter counts, over one window, a process's statements and the CPU of
// this process and of the server.
type loadMeter struct {
	b      *testing.B
	server func() time.Duration
}

// measure runs for loadWindow and returns statements per second of each
// counter, this process's CPU and the server's, in % of one core.
func (m loadMeter) measure(counters ...*atomic.Int64) (rates []float64, cpu, server float64) {
	before := make([]int64, len(counters))
	for i, c := range counters {
		before[i] = c.Load()
	}
	cpu0, srv0, start := testkit.CPUTime(), m.server(), time.Now()
	time.Sleep(loadWindow) // the measurement window itself, not synchronisation
	wall := time.Since(start)
	cpu = 100 * (testkit.CPUTime() - cpu0).Seconds() / wall.Seconds()
	server = 100 * (m.server() - srv0).Seconds() / wall.Seconds()
	for i, c := range counters {
		rates = append(rates, float64(c.Load()-before[i])/wall.Seconds())
	}
	return rates, cpu, server
}

// waitCount waits until c reaches n (the waiters' first reads), for at
// most a minute.
func waitCount(b *testing.B, c *atomic.Int64, n int64, what string) {
	deadline := time.Now().Add(time.Minute)
	for c.Load() < n {
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d statements after a minute, want %d", what, c.Load(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newPGBackend is one baton process: its own pool (statements counted in n)
// and Backend.
func newPGBackend(b *testing.B, db string, n *atomic.Int64, cfg backend.Config) *postgres.Backend {
	pool, _ := pgPool(b, db, n)
	be, err := postgres.New(context.Background(), pool, postgres.Options{Config: cfg})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = be.Close(ctx)
	})
	return be
}

// advisoryStandby polls keys the way the hand-rolled loop does, one loop
// per key: every advisoryPoll (at a phase of its own) it tries the lock
// on a pooled connection, which goes back to the pool when the lock is
// taken elsewhere. It runs until ctx ends; the keys must stay held by
// another process meanwhile.
func advisoryStandby(ctx context.Context, pool *pgxpool.Pool, keys []int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			phase := time.Duration(i) * advisoryPoll / time.Duration(len(keys))
			select {
			case <-ctx.Done():
				return
			case <-time.After(phase):
			}
			t := time.NewTicker(advisoryPoll)
			defer t.Stop()
			for {
				var ok bool
				if err := pool.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err == nil && ok {
					return // it leads this key now, on a connection back in the pool: not in this benchmark
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	return &wg
}

// BenchmarkPostgresLoadVsAdvisoryLock: what leading costs, baton beside
// the hand-rolled pg_try_advisory_lock loop, on one server in one run.
//
// steady: one holder of one lease and one standby, statements per second
// of each over loadWindow. baton at its default TTL (10 s): the holder
// renews its session, the standby reads when the holder's TTL is due. The
// loop: the holder's session keeps the lock (no statement), the standby
// tries every second.
//
// 10k: one process holds 10,000 leases (keys), then a second process
// stands by for all of them; statements per second of each, the CPU of
// this process (holder alone, then holder and standby: the standby's is
// the difference) and of the server. The loop keeps all 10,000 locks on
// one pooled connection's session, nothing else, and its standby polls
// each key every second, one loop per key, as the pattern does for one.
func BenchmarkPostgresLoadVsAdvisoryLock(b *testing.B) {
	db := testserver.SharedPostgres(b).NewDatabase(b)
	cfg := backend.Config{TTL: loadTTL}
	b.Run("steady/baton", func(b *testing.B) {
		var hn, sn atomic.Int64
		for i := 0; b.Loop(); i++ {
			lease := fmt.Sprintf("steady-%d-%d", time.Now().UnixNano(), i)
			holder := newPGBackend(b, db, &hn, cfg)
			standby := newPGBackend(b, db, &sn, cfg)
			t := mustCampaign(b, &process{backend: holder}, lease, "holder")
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			first := sn.Load()
			wg.Go(func() { _, _ = standby.Campaign(ctx, lease, baton.Candidate{ID: "standby"}) })
			waitCount(b, &sn, first+1, "standby")
			m := loadMeter{b: b, server: func() time.Duration { return 0 }}
			rates, _, _ := m.measure(&hn, &sn)
			b.ReportMetric(rates[0], "holder-stmt/s")
			b.ReportMetric(rates[1], "standby-stmt/s")
			b.ReportMetric((rates[0]+rates[1])/2, "stmt/s/process")
			cancel()
			wg.Wait()
			_ = t.Resign(context.Background())
		}
	})
	b.Run("steady/advisory", func(b *testing.B) {
		var hn, sn atomic.Int64
		for b.Loop() {
			key := time.Now().UnixNano()
			hp, _ := pgPool(b, db, &hn)
			sp, _ := pgPool(b, db, &sn)
			holder := &advisoryProcess{pool: hp}
			if ok, err := holder.try(context.Background(), key); !ok || err != nil {
				b.Fatalf("holder: %v %v", ok, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			first := sn.Load()
			wg := advisoryStandby(ctx, sp, []int64{key})
			waitCount(b, &sn, first+1, "standby")
			m := loadMeter{b: b, server: func() time.Duration { return 0 }}
			rates, _, _ := m.measure(&hn, &sn)
			b.ReportMetric(rates[0], "holder-stmt/s")
			b.ReportMetric(rates[1], "standby-stmt/s")
			b.ReportMetric((rates[0]+rates[1])/2, "stmt/s/process")
			cancel()
			wg.Wait()
			holder.held.Release()
		}
	})
	n := benchci.Size(10000, 20)
	b.Run("10k/baton", func(b *testing.B) {
		var hn, sn atomic.Int64
		for i := 0; b.Loop(); i++ {
			prefix := fmt.Sprintf("load-%d-%d", time.Now().UnixNano(), i)
			holder := newPGBackend(b, db, &hn, cfg)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 64)
			for k := range n {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					mustCampaign(b, &process{backend: holder}, fmt.Sprintf("%s-%05d", prefix, k), "holder")
				})
			}
			wg.Wait()
			pool, _ := pgPool(b, db, nil)
			m := loadMeter{b: b, server: serverCPU(b, pool)}
			rates, hcpu, srv := m.measure(&hn)
			b.ReportMetric(hcpu, "holder-cpu-%")
			b.ReportMetric(rates[0], "holder-stmt/s")
			b.ReportMetric(srv, "server-cpu-%")

			standby := newPGBackend(b, db, &sn, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			first := sn.Load()
			var failed atomic.Int64
			var firstErr atomic.Value
			for k := range n {
				wg.Go(func() {
					_, err := standby.Campaign(ctx, fmt.Sprintf("%s-%05d", prefix, k), baton.Candidate{ID: "standby"})
					if err != nil && ctx.Err() == nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
				})
			}
			waitCount(b, &sn, first+int64(n), "standby's first reads")
			rates, cpu, srv2 := m.measure(&hn, &sn)
			b.Logf("the standby's notifications: %+v; campaigns that failed: %d (%v)", standby.Notifications(), failed.Load(), firstErr.Load())
			b.ReportMetric(rates[0], "holder-stmt/s-with-standby")
			b.ReportMetric(rates[1], "standby-stmt/s")
			b.ReportMetric(cpu-hcpu, "standby-cpu-%")
			b.ReportMetric(srv2, "server-cpu-with-standby-%")
			cancel()
			wg.Wait()
			ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
			_ = standby.Close(ctx2)
			_ = holder.Close(ctx2)
			cancel2()
		}
	})
	b.Run("10k/advisory", func(b *testing.B) {
		var hn, sn atomic.Int64
		for b.Loop() {
			base := time.Now().UnixNano()
			keys := make([]int64, n)
			for k := range keys {
				keys[k] = base + int64(k)
			}
			hp, _ := pgPool(b, db, &hn)
			conn, err := hp.Acquire(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			for _, key := range keys {
				var ok bool
				if err := conn.QueryRow(context.Background(), "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil || !ok {
					b.Fatalf("lock %d: %v %v", key, ok, err)
				}
			}
			pool, _ := pgPool(b, db, nil)
			m := loadMeter{b: b, server: serverCPU(b, pool)}
			rates, hcpu, srv := m.measure(&hn)
			b.ReportMetric(hcpu, "holder-cpu-%")
			b.ReportMetric(rates[0], "holder-stmt/s")
			b.ReportMetric(srv, "server-cpu-%")

			sp, _ := pgPool(b, db, &sn)
			ctx, cancel := context.WithCancel(context.Background())
			first := sn.Load()
			wg := advisoryStandby(ctx, sp, keys)
			waitCount(b, &sn, first+int64(n), "standby's first polls")
			rates, cpu, srv2 := m.measure(&hn, &sn)
			b.ReportMetric(rates[0], "holder-stmt/s-with-standby")
			b.ReportMetric(rates[1], "standby-stmt/s")
			b.ReportMetric(cpu-hcpu, "standby-cpu-%")
			b.ReportMetric(srv2, "server-cpu-with-standby-%")
			cancel()
			wg.Wait()
			conn.Release()
			hp.Close() // the session ends, and its 10,000 locks with it
		}
	})
}
