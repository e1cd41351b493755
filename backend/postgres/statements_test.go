package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statements returns how many times statements starting with prefix ran
// in the pool's database since the last reset, from pg_stat_statements.
func statements(t *testing.T, pool *pgxpool.Pool, prefix string) int {
	t.Helper()
	return count(t, pool, `SELECT coalesce(sum(calls), 0)::int FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE $1`, prefix+"%")
}

func renewals(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return count(t, pool, "SELECT coalesce(sum(renewals), 0)::int FROM baton.sessions")
}

// TestOneRenewalPerProcess: a process holding 200 leases renews them with
// one statement per renew interval, and never writes their rows; a
// process waiting for 20 of them, notified by LISTEN, reads each only as
// the holder's TTL comes due, not every poll interval. Counted by
// pg_stat_statements on the server.
func TestOneRenewalPerProcess(t *testing.T) {
	const held, waiting = 200, 20
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	mustExec(t, check, "CREATE EXTENSION pg_stat_statements")
	const ttl = time.Second
	holder, waiter := newBackend(t, newPool(t, dbURL), ttl), newBackend(t, newPool(t, dbURL), ttl)
	prefix := testkit.Unique("many")
	for i := range held {
		testkit.Campaign(t, holder, fmt.Sprintf("%s-%03d", prefix, i), "holder")
	}
	testkit.Eventually(t, 30*time.Second, "the waiter's LISTEN connection", func() bool {
		return waiter.Notifications().Listening
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range waiting {
		go func() { _, _ = waiter.Campaign(ctx, fmt.Sprintf("%s-%03d", prefix, i), baton.Candidate{ID: "waiter"}) }()
	}
	// Let every waiter read once, then count from a clean slate.
	testkit.Eventually(t, 30*time.Second, "the waiters' first reads", func() bool {
		return statements(t, check, "SELECT l.holder") >= waiting
	})
	xmins := count(t, check, "SELECT count(DISTINCT xmin::text) FROM baton.leases")
	mustExec(t, check, "SELECT pg_stat_statements_reset()")
	before, start := renewals(t, check), time.Now()
	testkit.Eventually(t, 60*time.Second, "ten renewals", func() bool { return renewals(t, check) >= before+10 })
	after, window := renewals(t, check), time.Since(start)

	renews := statements(t, check, "UPDATE baton.sessions SET renewals")
	reads := statements(t, check, "SELECT l.holder")
	// A waiter's join of a lease's queue (once per waiter) writes only the
	// waiters table; it is a WITH statement too.
	joins := statements(t, check, "WITH j AS (INSERT INTO baton.waiters")
	writes := statements(t, check, "UPDATE baton.leases") + statements(t, check, "INSERT INTO baton.leases") + statements(t, check, "WITH ") - joins
	t.Logf("in %s: %d renewals of two sessions by %d statements; %d lease reads and %d queue joins by %d waiters; %d lease writes",
		window.Round(time.Millisecond), after-before, renews, reads, joins, waiting, writes)
	if joins > waiting {
		t.Errorf("%d queue joins by %d waiters: a waiter joins once", joins, waiting)
	}
	// Renewals counted before the reset but confirmed after, or the
	// reverse, may shift one per session.
	if renews > after-before+2 {
		t.Errorf("%d renewal statements for %d renewals: more than one statement per renewal", renews, after-before)
	}
	if writes != 0 {
		t.Errorf("%d writes of lease rows while nothing changed", writes)
	}
	if n := count(t, check, "SELECT count(DISTINCT xmin::text) FROM baton.leases"); n != xmins {
		t.Errorf("lease rows were rewritten while held: %d row versions, %d before", n, xmins)
	}
	// Each waiter reads when the holder's TTL comes due; polling every
	// renew interval (TTL/3) would read three times as often.
	if limit := waiting * (int(window/ttl) + 2); reads > limit {
		t.Errorf("%d reads by %d waiters in %s: more than one per TTL each (limit %d)", reads, waiting, window, limit)
	}
}

// TestStandbyReadsInBatches: a process waiting for 300 leases, all held by
// one other process, reads their rows in batches, about one statement per
// poll interval for all of them, not one read per lease per TTL (300 a
// second here). When the holder then vanishes without a word, the waiter
// takes every lease over. Counted by pg_stat_statements on the server;
// with notifications (the default) and without.
func TestStandbyReadsInBatches(t *testing.T) {
	for _, listen := range []bool{true, false} {
		t.Run(map[bool]string{true: "listen", false: "poll"}[listen], func(t *testing.T) { standbyReadsInBatches(t, listen) })
	}
}

func standbyReadsInBatches(t *testing.T, listen bool) {
	const n = 300
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	mustExec(t, check, "CREATE EXTENSION pg_stat_statements")
	const ttl = time.Second
	holderPool := newPool(t, dbURL)
	holder := newBackend(t, holderPool, ttl)
	waiter, err := postgres.New(context.Background(), newPool(t, dbURL), postgres.Options{Config: backend.Config{TTL: ttl}, NoListen: !listen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = waiter.Close(ctx)
	})
	prefix := testkit.Unique("standby")
	for i := range n {
		testkit.Campaign(t, holder, fmt.Sprintf("%s-%03d", prefix, i), "holder")
	}
	if listen {
		testkit.Eventually(t, 30*time.Second, "the waiter's LISTEN connection", func() bool {
			return waiter.Notifications().Listening
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	won := make(chan baton.Term, n)
	// The holder's campaigns read every lease too: count the waiter's.
	mustExec(t, check, "SELECT pg_stat_statements_reset()")
	for i := range n {
		go func() {
			// A campaign that found the database unavailable (a statement
			// over its TTL-long bound on a loaded machine) is tried again,
			// as Elector.Run does.
			var bo baton.Backoff
			for {
				term, err := waiter.Campaign(ctx, fmt.Sprintf("%s-%03d", prefix, i), baton.Candidate{ID: "waiter"})
				if err == nil {
					won <- term
					return
				}
				if !errors.Is(err, baton.ErrBackendUnavailable) {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(bo.Next()):
				}
			}
		}()
	}
	testkit.Eventually(t, 30*time.Second, "the waiters' first reads", func() bool {
		return statements(t, check, "SELECT l.holder") >= n
	})
	mustExec(t, check, "SELECT pg_stat_statements_reset()")
	before, start := renewals(t, check), time.Now()
	// Twenty renewals of the two sessions: over three TTLs.
	testkit.Eventually(t, 60*time.Second, "twenty renewals", func() bool { return renewals(t, check) >= before+20 })
	window := time.Since(start)
	single := statements(t, check, "SELECT l.holder")
	batches := statements(t, check, "SELECT l.name, l.holder")
	t.Logf("in %s: %d single lease reads and %d batch reads by a waiter for %d leases", window.Round(time.Millisecond), single, batches, n)
	if single >= n {
		t.Errorf("%d single lease reads in %s by a waiter for %d leases: its leases are read one by one, not in batches", single, window, n)
	}
	if limit := int(window/(ttl/3)) + 3; batches > limit || batches == 0 {
		t.Errorf("%d batch reads in %s: want about one per poll interval (%s), at most %d", batches, window, ttl/3, limit)
	}

	// The holder vanishes: its connections go, its session row stays.
	holderPool.Close()
	for i := range n {
		select {
		case <-won:
		case <-time.After(30 * time.Second):
			t.Fatalf("the waiter took over %d of %d leases within 30 s of the holder's end", i, n)
		}
	}
}
