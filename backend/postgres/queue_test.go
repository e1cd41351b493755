package postgres_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// queueBackend returns a Backend on a pool of its own whose waiters read
// a held lease only when its holder would have expired, minutes later:
// what happens within the queue tests' waits is the work of the
// notifications a release sends.
func queueBackend(t *testing.T, dbURL string) *postgres.Backend {
	t.Helper()
	b, err := postgres.New(context.Background(), newPool(t, dbURL), postgres.Options{Config: backend.Config{TTL: 3 * time.Minute}, PollInterval: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	testkit.Eventually(t, 30*time.Second, "the LISTEN connection", func() bool { return b.Notifications().Listening })
	return b
}

type campaignResult struct {
	who  int
	term baton.Term
	err  error
}

// leaseReads counts the reads of lease rows since the last reset of
// pg_stat_statements: one row (a waiter's own read) or many (a process's
// batch).
func leaseReads(t *testing.T, pool *pgxpool.Pool) int {
	return statements(t, pool, "SELECT l.")
}

// leaseTakes counts the attempts to take a free lease since the last
// reset.
func leaseTakes(t *testing.T, pool *pgxpool.Pool) int {
	return count(t, pool, `SELECT coalesce(sum(calls), 0)::int FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE '%UPDATE baton.leases l SET holder = $2%'`)
}

// waitQueued waits until n processes wait in the queue of lease, where
// the schema has one.
func waitQueued(t *testing.T, pool *pgxpool.Pool, lease string, n int) {
	t.Helper()
	if count(t, pool, "SELECT count(*)::int FROM (SELECT to_regclass('baton.waiters') AS r) x WHERE r IS NOT NULL") == 0 {
		return
	}
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d processes queued", n), func() bool {
		return count(t, pool, "SELECT count(*)::int FROM baton.waiters WHERE name = $1", lease) == n
	})
}

// TestReleaseWakesOneProcess: with many processes waiting for one lease,
// each release or hand-over makes one of them read the lease (the head of
// the queue, which takes it), not every one (a herd). Counted by
// pg_stat_statements on the server.
func TestReleaseWakesOneProcess(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	mustExec(t, check, "CREATE EXTENSION pg_stat_statements")
	const n = 6
	lease := testkit.Unique("herd")
	bs := make([]*postgres.Backend, n)
	for i := range bs {
		bs[i] = queueBackend(t, dbURL)
	}
	ctx := t.Context()
	holder, err := bs[0].Campaign(ctx, lease, baton.Candidate{ID: "p0"})
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan campaignResult, n)
	for i := 1; i < n; i++ {
		go func() {
			term, err := bs[i].Campaign(ctx, lease, baton.Candidate{ID: fmt.Sprintf("p%d", i)})
			results <- campaignResult{i, term, err}
		}()
	}
	testkit.Eventually(t, 30*time.Second, "every waiter's first read", func() bool { return leaseReads(t, check) >= n-1 })
	waitQueued(t, check, lease, n-1)
	mustExec(t, check, "SELECT pg_stat_statements_reset()")
	token := holder.Token()
	for range n - 1 {
		if err := holder.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("p%d: %v", r.who, r.err)
			}
			if r.term.Token() <= token {
				t.Fatalf("p%d took the lease with token %d after token %d", r.who, r.term.Token(), token)
			}
			holder, token = r.term, r.term.Token()
		case <-time.After(time.Minute):
			t.Fatal("no waiter took the released lease within a minute (a holder's expiry takes minutes: the release woke none)")
		}
	}
	reads, takes := leaseReads(t, check), leaseTakes(t, check)
	t.Logf("%d hand-overs, %d reads of the lease and %d attempts to take it by waiting processes", n-1, reads, takes)
	// One read and one take per hand-over: the woken head's, which takes
	// the lease. In a herd every waiting process reads on each release,
	// and most try to take it.
	if reads+takes > 2*(n-1) {
		t.Errorf("%d hand-overs cost %d reads of the lease and %d attempts to take it by waiting processes; want at most %d in all, a read and a take per hand-over", n-1, reads, takes, 2*(n-1))
	}
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestQueueHeadGoneWakesNext: the process at the head of the queue shut
// down (its session row deleted) without leaving the queue; a release
// wakes the next one at once.
func TestQueueHeadGoneWakesNext(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	lease := testkit.Unique("gone")
	a, head, next := queueBackend(t, dbURL), queueBackend(t, dbURL), queueBackend(t, dbURL)
	ctx := t.Context()
	holder, err := a.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan campaignResult, 2)
	go func() {
		term, err := head.Campaign(ctx, lease, baton.Candidate{ID: "head"})
		results <- campaignResult{1, term, err}
	}()
	waitQueued(t, check, lease, 1)
	go func() {
		term, err := next.Campaign(ctx, lease, baton.Candidate{ID: "next"})
		results <- campaignResult{2, term, err}
	}()
	waitQueued(t, check, lease, 2)
	// The head's process shuts down: its session row goes, its queue
	// entry stays (a closing Backend does not leave queues).
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := head.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, check, "SELECT count(*)::int FROM baton.waiters WHERE name = $1", lease); got != 2 {
		t.Fatalf("%d processes queued after the head closed, want 2 (its entry stays)", got)
	}
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(time.Minute)
	for {
		select {
		case r := <-results:
			if r.who == 1 {
				if r.err == nil {
					t.Fatal("the closed head took the lease")
				}
				continue
			}
			if r.err != nil {
				t.Fatalf("next: %v", r.err)
			}
			if err := r.term.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			return
		case <-deadline:
			t.Fatal("the next process did not take the released lease within a minute: the release woke the gone head only")
		}
	}
}

// queueChildMain is a waiting process (childEnv "queue"): it campaigns for
// the lease BATON_LEASE on DATABASE_URL as queueBackend's Backends do,
// prints "campaigning", and waits to be killed.
func queueChildMain() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	b, err := postgres.New(ctx, pool, postgres.Options{Config: backend.Config{TTL: 3 * time.Minute}, PollInterval: 10 * time.Minute})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	for !b.Notifications().Listening {
		time.Sleep(10 * time.Millisecond) // a child has no testkit; the parent bounds it
	}
	fmt.Println("campaigning")
	_, err = b.Campaign(ctx, os.Getenv("BATON_LEASE"), baton.Candidate{ID: "crashed"})
	fmt.Println("error:", err)
	return 1
}

// TestQueueHeadCrashedWakesNext: the process at the head of the queue is
// killed (SIGKILL) while its session row is still live (renewed within
// its TTL, minutes); a release wakes the next process at once, not when
// the crashed one's session lapses or the holder would have expired.
func TestQueueHeadCrashedWakesNext(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	lease := testkit.Unique("crashed")
	a, next := queueBackend(t, dbURL), queueBackend(t, dbURL)
	ctx := t.Context()
	holder, err := a.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	conns := func() int {
		return count(t, check, "SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database()")
	}
	before := conns()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=queue", "DATABASE_URL="+dbURL, "BATON_LEASE="+lease)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	said := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Scan()
		said <- sc.Text()
	}()
	select {
	case l := <-said:
		if l != "campaigning" {
			t.Fatalf("the waiting process: %q", l)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting process did not begin to campaign within a minute")
	}
	waitQueued(t, check, lease, 1)
	results := make(chan campaignResult, 1)
	go func() {
		term, err := next.Campaign(ctx, lease, baton.Candidate{ID: "next"})
		results <- campaignResult{2, term, err}
	}()
	waitQueued(t, check, lease, 2)

	// The head crashes: its connections close, its session row stays
	// live until its TTL passes unrenewed, and so does its queue entry.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	testkit.Eventually(t, 30*time.Second, "the crashed process's connections closed on the server", func() bool { return conns() <= before })
	if got := count(t, check, "SELECT count(*)::int FROM baton.sessions WHERE renewed_at > now() - ttl_ms * interval '1 millisecond'"); got != 3 {
		t.Fatalf("%d live sessions after the crash, want 3 (the crashed process's still live)", got)
	}
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-results:
		if r.err != nil {
			t.Fatalf("next: %v", r.err)
		}
		if r.term.Token() <= holder.Token() {
			t.Fatalf("next took the lease with token %d after token %d", r.term.Token(), holder.Token())
		}
		if err := r.term.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the next process did not take the released lease within a minute (the holder's expiry takes minutes): the release woke the crashed head only")
	}
}

// TestHandOverGoesToQueueHead: two processes, each with two candidates for
// one lease, one of each waiting in the process behind the other (a
// Backend's candidates take turns). A holder's resign hands the lease to
// the process that heads the lease's queue, not to the resigner's own next
// candidate, which needs no wake-up and would otherwise take it first: a
// process with many candidates would pass the lease among its own while
// the others wait.
func TestHandOverGoesToQueueHead(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	lease := testkit.Unique("turns")
	testkit.HandOversGoToQueueHead(t, queueBackend(t, dbURL), queueBackend(t, dbURL), lease, 6, func(n int) { waitQueued(t, check, lease, n) })
}
