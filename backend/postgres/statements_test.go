package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton"
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
	writes := statements(t, check, "UPDATE baton.leases") + statements(t, check, "INSERT INTO baton.leases") + statements(t, check, "WITH ")
	t.Logf("in %s: %d renewals of two sessions by %d statements; %d lease reads by %d waiters; %d lease writes",
		window.Round(time.Millisecond), after-before, renews, reads, waiting, writes)
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
