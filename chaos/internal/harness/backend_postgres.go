package harness

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// pgBackend is a real PostgreSQL cluster (testserver.Postgres) and a proxy
// per candidate in front of it, so that one candidate alone can be cut off
// or slowed down. The candidates use the cluster's postgres database, which
// a fresh cluster has too, as the superuser: baton creates its schema.
//
// A restart stops the server (fast shutdown) and starts it on its data; a
// wipe starts it on a new cluster (initdb): baton's schema, sessions,
// leases and their tokens are gone, as after a failover to a replica that
// never got them.
//
// With bouncer, a real PgBouncer in transaction-pooling mode stands between
// the proxies and the server (candidate → its proxy → PgBouncer →
// PostgreSQL), as a platform team runs it: the candidates' LISTEN probe
// fails there and their waiters poll. PgBouncer keeps running through the
// server's restarts and wipes, as it would in production.
type pgBackend struct {
	dir     string
	n       int
	bouncer bool

	pg      *testserver.Postgres
	pgb     *testserver.PgBouncer
	proxies []*testserver.Proxy

	mu   sync.Mutex
	wipe bool // the server is down, and comes back wiped
}

func (b *pgBackend) start() error {
	data := filepath.Join(b.dir, "postgres")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	pg, err := testserver.NewPostgres(data)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	b.pg = pg
	target := pg.Addr()
	if b.bouncer {
		dir := filepath.Join(b.dir, "pgbouncer")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		pgb, err := testserver.NewPgBouncer(pg, dir)
		if err != nil {
			return fmt.Errorf("start pgbouncer: %w", err)
		}
		b.pgb = pgb
		target = pgb.Addr()
	}
	for range b.n {
		p, err := testserver.NewProxy(target)
		if err != nil {
			return err
		}
		b.proxies = append(b.proxies, p)
	}
	return nil
}

func (b *pgBackend) candidate(i int) (args, env []string, host *netns.Host) {
	u, _ := url.Parse(b.pg.URL("postgres"))
	u.Host = b.proxies[i].Addr()
	return []string{"--backend", u.String()}, nil, nil
}

func (b *pgBackend) cut(i int) error  { b.proxies[i].Cut(); return nil }
func (b *pgBackend) heal(i int) error { b.proxies[i].Heal(); return nil }

func (b *pgBackend) slow(i int, d time.Duration) error {
	b.proxies[i].SetLatency(d)
	return nil
}

func (b *pgBackend) members() bool { return false }

// down stops the server; with wipe, up brings it back as a new cluster.
func (b *pgBackend) down(wipe bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pg.Stop()
	b.wipe = wipe
	return nil
}

// up starts the server again (on the same port) and returns once it
// answers queries.
func (b *pgBackend) up() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.pg.Restart(b.wipe); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	b.wipe = false
	return nil
}

// close stops the proxies, PgBouncer and the server.
func (b *pgBackend) close() {
	for _, p := range b.proxies {
		p.Close()
	}
	if b.pgb != nil {
		b.pgb.Close()
	}
	if b.pg != nil {
		b.pg.Close()
	}
}
