package redis_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	goredis "github.com/redis/go-redis/v9"
)

// newClient returns a client of addr, closed at the test's end. It does
// not retry: a test process that is cut off must see its requests fail.
func newClient(t testing.TB, addr, password string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr: addr, Password: password, ContextTimeoutEnabled: true,
		DialTimeout: 2 * time.Second, MaxRetries: -1,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newBackend returns a Backend on c, closed at the test's end.
func newBackend(t testing.TB, c goredis.UniversalClient, o redis.Options) *redis.Backend {
	t.Helper()
	b, err := redis.New(context.Background(), c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

// target is the conformance suite's Target on srv, each process through
// a proxy of its own (to cut it off).
func target(srv *testserver.Redis, o redis.Options) batontest.Target {
	return targetAs(srv, o, func(t testing.TB, addr string) *goredis.Client { return newClient(t, addr, srv.Password()) })
}

// targetAs is target with each process's client made by dial.
func targetAs(srv *testserver.Redis, o redis.Options, dial func(t testing.TB, addr string) *goredis.Client) batontest.Target {
	return batontest.Target{
		OneCampaignPerName: true,
		New: func(t *testing.T, cfg backend.Config) *batontest.Process {
			proxy := testserver.StartProxy(t, srv.Addr())
			o := o
			o.Config = cfg
			b := newBackend(t, dial(t, proxy.Addr()), o)
			if !o.NoPubSub {
				testkit.Eventually(t, 30*time.Second, "subscribed", func() bool { return b.Notifications().Listening })
			}
			var once sync.Once
			killed := make(chan struct{})
			return &batontest.Process{
				Backend: b,
				Kill: func() {
					once.Do(func() {
						close(killed)
						proxy.Cut()
					})
				},
				Cut: proxy.Cut,
				Heal: func() {
					select {
					case <-killed:
					default:
						proxy.Heal()
					}
				},
			}
		},
	}
}

// TestConformance runs the whole conformance suite against a real
// redis-server.
func TestConformance(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{Password: "s3cret"})
	batontest.Run(t, target(srv, redis.Options{}))
}

// TestConformancePolling runs it again with pub/sub off: waiters learn of
// releases by polling alone.
func TestConformancePolling(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	batontest.Run(t, target(srv, redis.Options{NoPubSub: true, PollInterval: 100 * time.Millisecond}))
}

// TestLeaderWatch: a process that only watches hears each holder in turn.
func TestLeaderWatch(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	batontest.LeaderWatch(t, target(srv, redis.Options{}))
}

// TestTokensRiseAcrossDataLoss: the server restarts without persistence
// and loses every key; tokens still rise.
func TestTokensRiseAcrossDataLoss(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	batontest.TokensRiseAcrossDataLoss(t, batontest.DataLoss{
		New: func(t *testing.T, logger *slog.Logger) baton.Backend {
			return newBackend(t, newClient(t, srv.Addr(), ""), redis.Options{Config: backend.Config{TTL: time.Second}, Logger: logger})
		},
		Lose: func(t *testing.T) {
			if err := srv.Restart(); err != nil {
				t.Fatalf("restart: %v", err)
			}
		},
	})
}

func init() { goredis.SetLogger(quietLogger{}) }

// quietLogger drops go-redis's own log lines (dial failures through a cut
// proxy, sentinels unreachable): the tests provoke them on purpose.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
