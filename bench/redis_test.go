package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
)

func init() { targets = append(targets, namedTarget{"redis", redisTarget}) }

// countingHook counts the round trips a client makes: one per command,
// one per pipeline.
type countingHook struct{ n *atomic.Int64 }

func (h countingHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h countingHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countingHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// redisClient returns a client of addr through a proxy of its own,
// counting round trips in n.
func redisClient(b *testing.B, addr string, n *atomic.Int64) (*goredis.Client, *testserver.Proxy) {
	proxy := testserver.StartProxy(b, addr)
	c := goredis.NewClient(&goredis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
	c.AddHook(countingHook{n})
	b.Cleanup(func() { _ = c.Close() })
	return c, proxy
}

// redisTarget runs against one redis-server; every simulated process has
// its own client behind its own proxy (killing a process cuts it off).
func redisTarget(b *testing.B) target {
	return redisTargetOn(testserver.StartRedis(b, testserver.RedisOptions{}))
}

// redsyncLimit bounds a redsync failover in the bench.
const redsyncLimit = 30 * time.Second

// BenchmarkRedisVsRedsync: baton's Redis backend (TTL 1 s, pub/sub) beside
// a redsync v4 mutex at its defaults (8 s expiry, 32 tries 50–250 ms
// apart, retried by the standby when they run out), one server: time from
// the holder's end to the standby's lead after a crash (the holder cut
// off) and a graceful release (Resign / Unlock), and the round trips per
// second per process while one holds and one waits.
func BenchmarkRedisVsRedsync(b *testing.B) {
	srv := testserver.StartRedis(b, testserver.RedisOptions{})
	b.Run("baton/crash", func(b *testing.B) { handOver(b, redisTargetOn(srv), true) })
	b.Run("baton/graceful", func(b *testing.B) { handOver(b, redisTargetOn(srv), false) })
	for _, crash := range []bool{true, false} {
		name := "redsync/graceful"
		if crash {
			name = "redsync/crash"
		}
		b.Run(name, func(b *testing.B) {
			var samples []time.Duration
			var n atomic.Int64
			for i := 0; b.Loop(); i++ {
				key := fmt.Sprintf("redsync-%d-%d", time.Now().UnixNano(), i)
				hc, hproxy := redisClient(b, srv.Addr(), &n)
				wc, _ := redisClient(b, srv.Addr(), &n)
				holder := redsync.New(rsgoredis.NewPool(hc)).NewMutex(key)
				if err := holder.Lock(); err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				ctx, cancel := context.WithTimeout(context.Background(), redsyncLimit)
				go func() {
					m := redsync.New(rsgoredis.NewPool(wc)).NewMutex(key)
					for ctx.Err() == nil {
						if err := m.LockContext(ctx); err == nil {
							got <- time.Now()
							return
						} else if !errors.Is(err, redsync.ErrFailed) && !isTaken(err) {
							b.Error(err)
						}
					}
					got <- time.Now()
				}()
				time.Sleep(100 * time.Millisecond) // let the standby start trying: a warm-up, not synchronisation
				start := time.Now()
				if crash {
					hproxy.Cut()
				} else if _, err := holder.Unlock(); err != nil {
					b.Fatal(err)
				}
				samples = append(samples, (<-got).Sub(start))
				cancel()
			}
			report(b, samples, "failover")
		})
	}
	b.Run("baton/requests", func(b *testing.B) { steadyRequests(b, redisTargetOn(srv)) })
	b.Run("redsync/requests", func(b *testing.B) {
		var n atomic.Int64
		key := fmt.Sprintf("redsync-steady-%d", time.Now().UnixNano())
		hc, _ := redisClient(b, srv.Addr(), &n)
		wc, _ := redisClient(b, srv.Addr(), &n)
		holder := redsync.New(rsgoredis.NewPool(hc)).NewMutex(key)
		if err := holder.Lock(); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { // the holder extends its mutex halfway through its expiry
			defer close(done)
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(holder.Until()) / 2):
					_, _ = holder.ExtendContext(ctx)
				}
			}
		}()
		go func() {
			m := redsync.New(rsgoredis.NewPool(wc)).NewMutex(key)
			for ctx.Err() == nil {
				_ = m.LockContext(ctx)
			}
		}()
		time.Sleep(benchci.Size(time.Second, 200*time.Millisecond)) // warm-up, not synchronisation
		window := benchci.Size(10*time.Second, time.Second)
		var rate float64
		for b.Loop() {
			before, start := n.Load(), time.Now()
			time.Sleep(window) // the measurement window itself
			rate = float64(n.Load()-before) / time.Since(start).Seconds() / 2
		}
		b.ReportMetric(rate, "req/s/process")
		cancel()
		<-done
	})
}

// isTaken reports redsync's error for a lock another holder has.
func isTaken(err error) bool {
	var e *redsync.ErrTaken
	return errors.As(err, &e)
}

// redisTargetOn is redisTarget on a server already started.
func redisTargetOn(srv *testserver.Redis) target {
	var n atomic.Int64
	return target{
		name: "redis",
		new: func(b *testing.B, cfg backend.Config) *process {
			c, proxy := redisClient(b, srv.Addr(), &n)
			be, err := redis.New(context.Background(), c, redis.Options{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = be.Close(ctx)
			})
			return &process{backend: be, kill: proxy.Cut}
		},
		requests: n.Load,
	}
}

// BenchmarkRedisTenThousandLeases: one process holding 10,000 leases (TTL
// 10 s) on one redis-server, with no other backend in the test process
// (BenchmarkTenThousandLeases/redis runs beside every other target's
// servers and groups, several of them in-process, whose CPU the process
// measure includes). The client dials the server directly. Reported:
// CPU of the process over a 20 s window (six renewals), heap held, round
// trips per renew interval, goroutines. BATON_BENCH_SMALL=1 holds 100
// leases for 4 s: a check that it still works, for CI.
func BenchmarkRedisTenThousandLeases(b *testing.B) {
	srv := testserver.StartRedis(b, testserver.RedisOptions{})
	n, window := 10000, 20*time.Second
	if benchci.Small() { // CI: that it still works, not its figures
		n, window = 100, 4*time.Second
	}
	cfg := backend.Config{TTL: 10 * time.Second}
	for b.Loop() {
		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		var trips atomic.Int64
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
		c.AddHook(countingHook{&trips})
		be, err := redis.New(context.Background(), c, redis.Options{Config: cfg})
		if err != nil {
			b.Fatal(err)
		}
		terms := holdMany(b, be, fmt.Sprintf("ten-thousand-%d", time.Now().UnixNano()), n)
		trips0, cpu0, start := trips.Load(), testkit.CPUTime(), time.Now()
		time.Sleep(window) // the measurement window itself, not synchronisation
		cpu, wall, calls := testkit.CPUTime()-cpu0, time.Since(start), trips.Load()-trips0
		runtime.GC()
		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		for _, t := range terms {
			if t.Err() != nil {
				b.Fatalf("lease %s ended while held: %v", t.Lease(), t.Err())
			}
		}
		cfgd, _ := cfg.WithDefaults()
		b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
		b.ReportMetric(float64(int64(m1.HeapInuse)-int64(m0.HeapInuse))/(1<<20), "heap-MB")
		b.ReportMetric(float64(calls)/(wall.Seconds()/cfgd.RenewInterval.Seconds()), "trips/renew-interval")
		b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := be.Close(ctx); err != nil {
			b.Error(err)
		}
		cancel()
		_ = c.Close()
	}
}

// BenchmarkRedisRunHandOver: three `baton run --backend redis://… --ttl 2s`
// processes on one redis-server, as three hosts would run them. Each
// iteration sends SIGTERM to the holder (graceful: baton stops its
// command, releases the key and publishes the release) and measures the
// time until the next holder's command has started and said so on its
// stdout; starts a third process again; then kills the holder's whole
// process group with SIGKILL (a crash: the key stays until it expires, a
// TTL after the last renewal at most) and measures the same. Reported as
// p50 and p99 of each (by nearest rank: the maximum below 100 samples):
//
//	go test -run '^$' -bench RedisRunHandOver -benchtime 100x ./bench
func BenchmarkRedisRunHandOver(b *testing.B) { redisRunHandOver(b, "") }

// BenchmarkRedisRunHandOverGrant is BenchmarkRedisRunHandOver with
// ?baton_grant=on: a release grants the lease to the waiting process at
// the head of the queue, which needs no acquisition round trip of its own.
//
//	go test -run '^$' -bench RedisRunHandOverGrant -benchtime 100x ./bench
func BenchmarkRedisRunHandOverGrant(b *testing.B) { redisRunHandOver(b, "?baton_grant=on") }

func redisRunHandOver(b *testing.B, query string) {
	srv := testserver.StartRedis(b, testserver.RedisOptions{})
	bin := buildBaton(b)
	lease := fmt.Sprintf("redis-run-handover-%d", time.Now().UnixNano())
	var (
		mu     sync.Mutex
		leader = make(chan *runProc, 4)
		procs  = map[*runProc]bool{}
	)
	start := func(i int) {
		p := &runProc{id: fmt.Sprintf("baton-%d", i), leader: leader, out: new(testserver.SyncBuffer)}
		p.cmd = exec.Command(bin, "run", "--backend", "redis://"+srv.Addr()+"/0"+query, "--lease", lease, "--id", p.id,
			"--ttl", handOverTTL.String(), "--log-level", "warn", "--",
			"sh", "-c", `echo "LEADER $BATON_HOLDER"; exec sleep 100000`)
		p.cmd.Env = cleanEnv()
		p.cmd.Stdout = p
		p.cmd.Stderr = p.out
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		p.cmd.WaitDelay = time.Second
		p.exited = make(chan struct{})
		if err := p.cmd.Start(); err != nil {
			b.Fatal(err)
		}
		go func() {
			defer close(p.exited)
			_ = p.cmd.Wait()
		}()
		b.Cleanup(func() {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
			if b.Failed() {
				b.Logf("output of %s:\n%s", p.id, p.out)
			}
		})
		mu.Lock()
		procs[p] = true
		mu.Unlock()
	}
	// subscribed waits until n processes listen for releases (each
	// process's one pub/sub connection): up, and past its first campaign
	// attempt.
	subscribed := func(n int) {
		waitFor(b, 30*time.Second, fmt.Sprintf("%d processes subscribed", n), func() (bool, error) {
			v, err := srv.Do("PUBSUB", "NUMSUB", redis.Channel(""))
			a, _ := v.([]any)
			if err != nil || len(a) != 2 {
				return false, err
			}
			c, _ := a[1].(int64)
			return c == int64(n), nil
		})
	}
	next := 0
	for range 3 {
		start(next)
		next++
		subscribed(next)
	}
	var holder *runProc
	select {
	case holder = <-leader:
	case <-time.After(30 * time.Second):
		b.Fatal("no baton run's command started")
	}
	// handOver ends the holder's run with stop, and returns the time until
	// the next holder's command started.
	handOver := func(stop func()) time.Duration {
		t0 := time.Now()
		stop()
		var nh *runProc
		select {
		case nh = <-leader:
		case <-time.After(30 * time.Second):
			b.Fatalf("no command started within 30s of stopping %s", holder.id)
		}
		if nh == holder {
			b.Fatalf("%s led again", holder.id)
		}
		select {
		case <-holder.exited:
		case <-time.After(30 * time.Second):
			b.Fatalf("%s did not exit within 30s", holder.id)
		}
		holder = nh
		start(next)
		next++
		subscribed(3)
		return nh.at.Sub(t0)
	}
	var graceful, crash []time.Duration
	for b.Loop() {
		graceful = append(graceful, handOver(func() {
			if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				b.Fatal(err)
			}
		}))
		crash = append(crash, handOver(func() {
			if err := syscall.Kill(-holder.cmd.Process.Pid, syscall.SIGKILL); err != nil {
				b.Fatal(err)
			}
		}))
	}
	percentiles(b, graceful, "run-sigterm")
	percentiles(b, crash, "run-kill")
	b.Logf("SIGTERM to the next command's start: %v", graceful)
	b.Logf("kill -9 to the next command's start: %v", crash)
}

var (
	_ = benchci.Register(BenchmarkRedisTenThousandLeases, "cpu-%>=0", "heap-MB", "trips/renew-interval>0", "goroutines>0")
	_ = benchci.Register(BenchmarkRedisRunHandOver, "run-sigterm-p50-ms>0", "run-sigterm-p99-ms>0", "run-kill-p50-ms>0")
	_ = benchci.Register(BenchmarkRedisRunHandOverGrant, "run-sigterm-p50-ms>0", "run-sigterm-p99-ms>0", "run-kill-p50-ms>0")
)
