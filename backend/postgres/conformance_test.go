package postgres_test

import (
	"context"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestMain stops the PostgreSQL cluster the package's tests share.
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(childMain(mode))
	}
	code := m.Run()
	testserver.StopSharedPostgres()
	os.Exit(code)
}

// TestConformance runs the whole conformance suite on a direct connection,
// each process through a proxy of its own (to cut it off).
func TestConformance(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	batontest.Run(t, target(t, pg.NewDatabase(t), func(t *testing.T, b *postgres.Backend) {
		testkit.Eventually(t, 30*time.Second, "LISTEN on a direct connection", func() bool { return b.Notifications().Listening })
	}))
}

// TestLeaderWatch: a process that only watches hears each holder in turn,
// from NOTIFY (a killed holder until its successor took over).
func TestLeaderWatch(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	batontest.LeaderWatch(t, target(t, pg.NewDatabase(t), func(t *testing.T, b *postgres.Backend) {
		testkit.Eventually(t, 30*time.Second, "LISTEN on a direct connection", func() bool { return b.Notifications().Listening })
	}))
}

// TestLeaderWatchThroughPgBouncer: the same by polling.
func TestLeaderWatchThroughPgBouncer(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg)
	batontest.LeaderWatch(t, target(t, bouncer.Via(pg.NewDatabase(t)), nil))
}

// TestConformanceThroughPgBouncer runs it again through PgBouncer in
// transaction-pooling mode, where LISTEN cannot work: every process must
// find that out and poll.
func TestConformanceThroughPgBouncer(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg)
	db := bouncer.Via(pg.NewDatabase(t))
	var checks []func(t *testing.T)
	batontest.Run(t, target(t, db, func(t *testing.T, b *postgres.Backend) {
		checks = append(checks, func(t *testing.T) {
			if st := b.Notifications(); st.Listening {
				t.Errorf("notifications through PgBouncer: %+v; want polling", st)
			}
		})
	}))
	for _, c := range checks {
		c(t)
	}
}

// TestTokensRiseAcrossDataLoss: the cluster loses all its data (a new
// initdb behind the same address); tokens still rise.
func TestTokensRiseAcrossDataLoss(t *testing.T) {
	pg := testserver.StartPostgres(t)
	dbURL := pg.URL("postgres")
	batontest.TokensRiseAcrossDataLoss(t, batontest.DataLoss{
		New: func(t *testing.T, logger *slog.Logger) baton.Backend {
			pool := newPool(t, dbURL)
			b, err := postgres.New(context.Background(), pool, postgres.Options{Config: backend.Config{TTL: time.Second}, Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			return b
		},
		Lose: func(t *testing.T) {
			if err := pg.Restart(true); err != nil {
				t.Fatalf("wipe: %v", err)
			}
		},
	})
}

// newPool returns a pool on rawURL, closed at the test's end.
func newPool(t testing.TB, rawURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// withHost returns rawURL with its host and port replaced by addr.
func withHost(t testing.TB, rawURL, addr string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// target is the conformance suite's Target on database dbURL. Through
// PgBouncer (transaction pooling, no prepared statements), statements must
// not be cached.
func target(t *testing.T, dbURL string, made func(*testing.T, *postgres.Backend)) batontest.Target {
	u, _ := url.Parse(dbURL)
	return batontest.Target{
		OneCampaignPerName: true,
		KeepsKilledHolder:  true,
		New: func(t *testing.T, cfg backend.Config) *batontest.Process {
			proxy := testserver.StartProxy(t, u.Host)
			pool := newPool(t, withHost(t, dbURL, proxy.Addr()))
			b, err := postgres.New(context.Background(), pool, postgres.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			if made != nil {
				made(t, b)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = b.Close(ctx)
			})
			var once sync.Once
			killed := make(chan struct{})
			return &batontest.Process{
				Backend: b,
				// A process killed with -9 sends nothing more: cut it off
				// for good.
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
