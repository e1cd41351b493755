package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestReleaseWakesWaiter: with a TTL of 30 s and a poll interval of a
// minute, a waiter can take a released lease within 15 s only if the
// release's NOTIFY woke it: on a direct connection, and through PgBouncer
// in transaction-pooling mode with a direct connection for LISTEN
// (Options.Listen).
func TestReleaseWakesWaiter(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg)
	for _, viaBouncer := range []bool{false, true} {
		name := "direct"
		if viaBouncer {
			name = "pgbouncer+direct-listen"
		}
		t.Run(name, func(t *testing.T) {
			dbURL := pg.NewDatabase(t)
			check := newPool(t, dbURL)
			mustExec(t, check, "CREATE EXTENSION pg_stat_statements")
			opts := postgres.Options{Config: backend.Config{TTL: 30 * time.Second}, PollInterval: time.Minute}
			url := dbURL
			if viaBouncer {
				direct, err := pgx.ParseConfig(dbURL)
				if err != nil {
					t.Fatal(err)
				}
				url, opts.Listen = bouncer.Via(dbURL), direct
			}
			a, err := postgres.New(context.Background(), newPool(t, url), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(context.Background())
			w, err := postgres.New(context.Background(), newPool(t, url), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close(context.Background())
			testkit.Eventually(t, 30*time.Second, "LISTEN", func() bool { return w.Notifications().Listening })
			lease := testkit.Unique("wake")
			ta := testkit.Campaign(t, a, lease, "a")
			reads := statements(t, check, "SELECT l.holder")
			got := testkit.CampaignAsync(t, w, lease, "w")
			// The waiter read the lease, held, and waits.
			testkit.Eventually(t, 30*time.Second, "the waiter's read", func() bool {
				return statements(t, check, "SELECT l.holder") > reads
			})
			if err := ta.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			won := testkit.WaitTerm(t, got, 15*time.Second)
			if won.Term.Token() <= ta.Token() {
				t.Errorf("token %d after %d", won.Term.Token(), ta.Token())
			}
		})
	}
}

// TestReleaseBeforeJoinWakesWaiter: a waiter reads the lease, held, and
// the holder releases it before the waiter has joined the lease's queue,
// so the release finds nobody to wake. With a TTL of 30 s and a poll
// interval of a minute, the waiter takes the lease within 15 s only if
// its join notices the release.
func TestReleaseBeforeJoinWakesWaiter(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	opts := postgres.Options{Config: backend.Config{TTL: 30 * time.Second}, PollInterval: time.Minute}
	a, err := postgres.New(context.Background(), newPool(t, dbURL), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	reached, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	w, err := postgres.New(context.Background(), newPool(t, dbURL), postgres.WithBeforeJoin(opts, func(string) {
		once.Do(func() {
			close(reached)
			<-resume
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	testkit.Eventually(t, 30*time.Second, "LISTEN", func() bool { return w.Notifications().Listening })
	lease := testkit.Unique("joinrace")
	ta := testkit.Campaign(t, a, lease, "a")
	got := testkit.CampaignAsync(t, w, lease, "w")
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter never came to join the queue")
	}
	if err := ta.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(resume)
	won := testkit.WaitTerm(t, got, 15*time.Second)
	if won.Term.Token() <= ta.Token() {
		t.Errorf("token %d after %d", won.Term.Token(), ta.Token())
	}
}

// TestPgBouncerFallsBackToPolling: through PgBouncer in transaction-pooling
// mode, the LISTEN probe finds that notifications never arrive; the
// Backend says so once in its log and in Notifications, and its waiters
// poll.
func TestPgBouncerFallsBackToPolling(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg)
	logs := &batontest.Log{Level: slog.LevelWarn}
	b, err := postgres.New(context.Background(), newPool(t, bouncer.Via(pg.NewDatabase(t))), postgres.Options{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	testkit.Eventually(t, 30*time.Second, "the switch to polling", func() bool { return b.Notifications().Polling })
	st := b.Notifications()
	if st.Listening || !strings.Contains(st.Reason, "PgBouncer") {
		t.Errorf("Notifications = %+v", st)
	}
	n := 0
	for _, m := range logs.Messages() {
		if strings.Contains(m, "poll") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d log lines about polling, want 1: %q", n, logs.Messages())
	}
}

// TestSessionDeletedByOperator: an operator deletes a process's session
// row. A contender does not take its lease at once (the holder learns of
// it only at its next renewal): the holder's term ends, with
// ErrLeaseLost, before the contender's begins. The holder's next campaign,
// on a free lease, starts a new session and wins rather than spin on the
// acquisition that needs the old one.
func TestSessionDeletedByOperator(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	pool := newPool(t, dbURL)
	const ttl = 3 * time.Second
	b, other := newBackend(t, pool, ttl), newBackend(t, newPool(t, dbURL), ttl)
	lease := testkit.Unique("op")
	held := testkit.Campaign(t, b, lease, "a")
	// The contender reads the lease, held, before the row goes.
	got := testkit.CampaignAsync(t, other, lease, "b")
	mustExec(t, pool, "DELETE FROM baton.sessions WHERE id = (SELECT session FROM baton.leases WHERE name = $1)", lease)
	won := testkit.WaitTerm(t, got, 30*time.Second)
	wonAt := time.Now()
	select {
	case <-held.Done():
	default:
		t.Fatalf("the contender won at %s while the holder's term was still running", wonAt)
	}
	if !errors.Is(held.Err(), baton.ErrLeaseLost) {
		t.Errorf("the held term ended with %v, want ErrLeaseLost", held.Err())
	}
	if won.Term.Token() <= held.Token() {
		t.Errorf("token %d after %d", won.Term.Token(), held.Token())
	}
	term := testkit.CampaignWithin(t, b, testkit.Unique("op"), "a", 30*time.Second)
	if term.Err() != nil {
		t.Errorf("the new term: %v", term.Err())
	}
}

// TestLongLeaseName: a name too long for a NOTIFY payload is refused up
// front, naming the limit; one at the limit works.
func TestLongLeaseName(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	b := newBackend(t, newPool(t, pg.NewDatabase(t)), time.Second)
	_, err := b.Campaign(context.Background(), strings.Repeat("x", postgres.MaxNameLen+1), baton.Candidate{ID: "a"})
	if err == nil || !strings.Contains(err.Error(), "MaxNameLen") {
		t.Errorf("a name of %d bytes: %v; want an error naming MaxNameLen", postgres.MaxNameLen+1, err)
	}
	term := testkit.Campaign(t, b, strings.Repeat("y", postgres.MaxNameLen), "a")
	if err := term.Resign(context.Background()); err != nil {
		t.Errorf("resign: %v", err)
	}
}

// TestHalfOpenListenConnectionReplaced: the server process behind the
// waiter's LISTEN connection is stopped (SIGSTOP): its socket stays open
// and silent, as a half-open connection is, so the release's NOTIFY never
// reaches the waiter and nothing reports an error. With a TTL of 30 s and
// a poll interval of a minute, the waiter takes the released lease within
// 15 s only if the silent connection was pinged, given up and replaced
// (and its waiters told to read again).
func TestHalfOpenListenConnectionReplaced(t *testing.T) {
	listenConnectionLost(t, func(t *testing.T, check *pgxpool.Pool, pid int) {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("stop the LISTEN connection's server process %d: %v", pid, err)
		}
		t.Cleanup(func() {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			mustExec(t, check, "SELECT pg_terminate_backend($1)", pid)
		})
	})
}

// TestTerminatedListenConnectionReplaced: the server ends the waiter's
// LISTEN connection (pg_terminate_backend); the waiter takes the released
// lease within 15 s (TTL 30 s, a poll interval of a minute) only if the
// lost connection made its waiters read again, or it was opened again in
// time for the release's NOTIFY.
func TestTerminatedListenConnectionReplaced(t *testing.T) {
	listenConnectionLost(t, func(t *testing.T, check *pgxpool.Pool, pid int) {
		mustExec(t, check, "SELECT pg_terminate_backend($1)", pid)
	})
}

// listenConnectionLost: a holder and a waiter on a lease; once the waiter
// waits, lose hurts the server process of the waiter's LISTEN connection
// (pid), and the holder resigns; the waiter must win within 15 s, half its
// TTL, with a poll interval of a minute.
func listenConnectionLost(t *testing.T, lose func(t *testing.T, check *pgxpool.Pool, pid int)) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	mustExec(t, check, "CREATE EXTENSION pg_stat_statements")
	base := postgres.Options{Config: backend.Config{TTL: 30 * time.Second}, PollInterval: time.Minute}
	holderOpts := base
	holderOpts.NoListen = true // the waiter's is the database's only LISTEN connection
	a, err := postgres.New(context.Background(), newPool(t, dbURL), holderOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	w, err := postgres.New(context.Background(), newPool(t, dbURL),
		postgres.WithListenTiming(base, 500*time.Millisecond, 2*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	testkit.Eventually(t, 30*time.Second, "LISTEN", func() bool { return w.Notifications().Listening })
	var pid int
	if err := check.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'baton listen %'`).Scan(&pid); err != nil {
		t.Fatalf("the LISTEN connection's server process: %v", err)
	}
	lease := testkit.Unique("halfopen")
	ta := testkit.Campaign(t, a, lease, "a")
	reads := statements(t, check, "SELECT l.holder")
	got := testkit.CampaignAsync(t, w, lease, "w")
	testkit.Eventually(t, 30*time.Second, "the waiter's read", func() bool {
		return statements(t, check, "SELECT l.holder") > reads
	})
	lose(t, check, pid)
	if err := ta.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	won := testkit.WaitTerm(t, got, 15*time.Second)
	if won.Term.Token() <= ta.Token() {
		t.Errorf("token %d after %d", won.Term.Token(), ta.Token())
	}
}

// TestFailedProbeRetried: the LISTEN connection first leads to PgBouncer
// in transaction-pooling mode (a listen URL that points at the pooler), so
// the probe finds that notifications do not arrive and waiters poll; then
// the same address leads to the server itself. The probe is tried again,
// notifications are used again, and the Backend says so in its log and in
// Notifications. The switch to polling is logged once.
func TestFailedProbeRetried(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg)
	dbURL := pg.NewDatabase(t)
	listenProxy := testserver.StartProxy(t, bouncer.Addr())
	listen, err := pgx.ParseConfig(withHost(t, dbURL, listenProxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	logs := &batontest.Log{Level: slog.LevelInfo}
	opts := postgres.Options{Config: backend.Config{TTL: 3 * time.Second}, Listen: listen, Logger: slog.New(logs)}
	b, err := postgres.New(context.Background(), newPool(t, dbURL), postgres.WithListenTiming(opts, 0, 0, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	testkit.Eventually(t, 30*time.Second, "the switch to polling", func() bool { return b.Notifications().Polling })
	listenProxy.Retarget(pg.Addr())
	testkit.Eventually(t, 60*time.Second, "notifications again", func() bool { return b.Notifications().Listening })
	if st := b.Notifications(); st.Polling || st.Reason != "" {
		t.Errorf("Notifications = %+v after the probe succeeded", st)
	}
	polling, again := 0, 0
	for _, m := range logs.Messages() {
		if strings.Contains(m, "waiters poll") {
			polling++
		}
		if strings.Contains(m, "notifications arrive again") {
			again++
		}
	}
	if polling != 1 || again != 1 {
		t.Errorf("%d lines about polling and %d about notifications again, want 1 each: %q", polling, again, logs.Messages())
	}
}
