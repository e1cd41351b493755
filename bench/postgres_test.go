package bench

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() { targets = append(targets, namedTarget{"postgres", postgresTarget}) }

// countingTracer counts the statements a pool sends, as the server
// receives them.
type countingTracer struct{ n *atomic.Int64 }

func (c countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// pgPool opens a pool to the database of dbURL through a proxy of its own,
// counting statements in n (nil: not counted).
func pgPool(b *testing.B, dbURL string, n *atomic.Int64) (*pgxpool.Pool, *testserver.Proxy) {
	return pgPoolWith(b, dbURL, n, 0)
}

// pgPoolWith is pgPool with at most maxConns connections (0: pgxpool's
// default).
func pgPoolWith(b *testing.B, dbURL string, n *atomic.Int64, maxConns int32) (*pgxpool.Pool, *testserver.Proxy) {
	u, err := url.Parse(dbURL)
	if err != nil {
		b.Fatal(err)
	}
	proxy := testserver.StartProxy(b, u.Host)
	u.Host = proxy.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		b.Fatal(err)
	}
	if n != nil {
		cfg.ConnConfig.Tracer = countingTracer{n}
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool, proxy
}

// postgresTarget runs against one PostgreSQL cluster; every simulated
// process has its own pool behind its own proxy, so that killing a process
// closes its connections (the server sees them end, as after kill -9)
// without deleting its session row.
func postgresTarget(b *testing.B) target {
	return postgresTargetWith(b, 0)
}

// postgresTargetWith is postgresTarget with pools of at most maxConns
// connections each (0: pgxpool's default, four on this machine).
func postgresTargetWith(b *testing.B, maxConns int32) target {
	db := testserver.SharedPostgres(b).NewDatabase(b)
	var n atomic.Int64
	return target{
		name: "postgres",
		new: func(b *testing.B, cfg backend.Config) *process {
			pool, proxy := pgPoolWith(b, db, &n, maxConns)
			be, err := postgres.New(context.Background(), pool, postgres.Options{Config: cfg})
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

// advisoryPoll is how often the hand-rolled loop's standbys try the lock:
// the common pattern polls every second.
const advisoryPoll = time.Second

// advisoryLimit is the bench's own bound on a failover of the hand-rolled
// loop: after a network cut of its holder, the server keeps the session,
// and with it the lock, until TCP keepalive gives up (about two hours
// with Linux's defaults).
var advisoryLimit = benchci.Size(20*time.Second, 2*time.Second)

// advisoryProcess is one process of the hand-rolled loop: a session
// advisory lock taken with pg_try_advisory_lock on a pooled connection,
// which it keeps while it leads.
type advisoryProcess struct {
	pool  *pgxpool.Pool
	proxy *testserver.Proxy
	held  *pgxpool.Conn
}

// try takes the lock if it is free, keeping the connection that holds it.
func (p *advisoryProcess) try(ctx context.Context, key int64) (bool, error) {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	var ok bool
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
		c.Release()
		return false, err
	}
	if !ok {
		c.Release()
		return false, nil
	}
	p.held = c
	return true, nil
}

// wait polls every advisoryPoll until it holds the lock, or ctx ends.
func (p *advisoryProcess) wait(ctx context.Context, key int64) bool {
	t := time.NewTicker(advisoryPoll)
	defer t.Stop()
	for {
		if ok, _ := p.try(ctx, key); ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// BenchmarkPostgresVsAdvisoryLock: baton's PostgreSQL backend (TTL 1 s,
// LISTEN/NOTIFY) beside the hand-rolled pg_try_advisory_lock loop (standbys
// poll every second) on one server: time from the holder's end to the
// standby's lead after a crash (its connections closed), a network cut
// (its connections held open, nothing forwarded: the server cannot tell),
// and a graceful release. A failover that does not happen within
// advisoryLimit is reported as advisoryLimit ("timeouts" counts them).
func BenchmarkPostgresVsAdvisoryLock(b *testing.B) {
	db := testserver.SharedPostgres(b).NewDatabase(b)
	cfg := backend.Config{TTL: time.Second}
	for _, event := range []string{"crash", "cut", "graceful"} {
		b.Run("baton/"+event, func(b *testing.B) {
			var samples []time.Duration
			timeouts := 0
			for i := 0; b.Loop(); i++ {
				lease := fmt.Sprintf("vs-%s-%d-%d", event, time.Now().UnixNano(), i)
				hp, hproxy := pgPool(b, db, nil)
				holder, err := postgres.New(context.Background(), hp, postgres.Options{Config: cfg})
				if err != nil {
					b.Fatal(err)
				}
				wp, _ := pgPool(b, db, nil)
				waiter, err := postgres.New(context.Background(), wp, postgres.Options{Config: cfg})
				if err != nil {
					b.Fatal(err)
				}
				th := mustCampaign(b, &process{backend: holder}, lease, "holder")
				got := make(chan time.Time, 1)
				ctx, cancel := context.WithTimeout(context.Background(), advisoryLimit+cfg.TTL)
				go func() {
					if _, err := waiter.Campaign(ctx, lease, baton.Candidate{ID: "waiter"}); err == nil {
						got <- time.Now()
					}
				}()
				first := th.SafeUntil()
				for !th.SafeUntil().After(first) {
					time.Sleep(5 * time.Millisecond)
				}
				start := time.Now()
				switch event {
				case "crash":
					hproxy.Cut()
				case "cut":
					hproxy.SetLatency(time.Hour)
				case "graceful":
					_ = th.Resign(context.Background())
				}
				select {
				case at := <-got:
					samples = append(samples, at.Sub(start))
				case <-time.After(advisoryLimit):
					samples = append(samples, advisoryLimit)
					timeouts++
				}
				cancel()
				hproxy.SetLatency(0)
				cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = waiter.Close(cctx)
				_ = holder.Close(cctx)
				ccancel()
			}
			report(b, samples, event)
			b.ReportMetric(float64(timeouts), "timeouts")
		})
		b.Run("advisory/"+event, func(b *testing.B) {
			var samples []time.Duration
			timeouts := 0
			for i := 0; b.Loop(); i++ {
				key := time.Now().UnixNano()
				hp, hproxy := pgPool(b, db, nil)
				wp, _ := pgPool(b, db, nil)
				holder := &advisoryProcess{pool: hp, proxy: hproxy}
				waiter := &advisoryProcess{pool: wp}
				if ok, err := holder.try(context.Background(), key); !ok || err != nil {
					b.Fatalf("holder: %v %v", ok, err)
				}
				got := make(chan time.Time, 1)
				ctx, cancel := context.WithTimeout(context.Background(), advisoryLimit+time.Second)
				go func() {
					if waiter.wait(ctx, key) {
						got <- time.Now()
					}
				}()
				// The standby polls at a phase of its own; the event comes
				// at a random point of its period, as in production.
				time.Sleep(time.Duration(time.Now().UnixNano() % int64(advisoryPoll)))
				start := time.Now()
				switch event {
				case "crash":
					hproxy.Cut()
				case "cut":
					hproxy.SetLatency(time.Hour)
				case "graceful":
					_, _ = holder.held.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", key)
				}
				select {
				case at := <-got:
					samples = append(samples, at.Sub(start))
				case <-time.After(advisoryLimit):
					samples = append(samples, advisoryLimit)
					timeouts++
				}
				cancel()
				// The cut holder's session still holds the lock on the
				// server; end it so that the next iteration starts clean.
				hproxy.SetLatency(0)
				hproxy.Cut()
				if waiter.held != nil {
					waiter.held.Release()
				}
				holder.held.Release()
			}
			report(b, samples, event)
			b.ReportMetric(float64(timeouts), "timeouts")
		})
	}
}
