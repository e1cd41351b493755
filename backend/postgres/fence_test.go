package postgres_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newBackend returns a Backend on pool with ttl, closed at the test's end.
func newBackend(t testing.TB, pool *pgxpool.Pool, ttl time.Duration) *postgres.Backend {
	t.Helper()
	b, err := postgres.New(context.Background(), pool, postgres.Options{Config: backend.Config{TTL: ttl}})
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

func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestFence: the holder's fenced transaction commits; once the lease was
// handed over, a transaction fenced on the old token fails (ErrFenced,
// IsFenced) and writes nothing, through the Go helper and through psql
// with BATON_TOKEN as a `baton run` child would.
func TestFence(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg)
	t.Run("direct", func(t *testing.T) {
		db := pg.NewDatabase(t)
		fence(t, db, db)
	})
	// The test's own statements (pgx caches prepared statements by
	// default, which PgBouncer 1.18's transaction pooling cannot carry
	// across transactions) run in exec mode; baton's need no setting.
	t.Run("pgbouncer", func(t *testing.T) {
		db := bouncer.Via(pg.NewDatabase(t))
		fence(t, db, db+"&default_query_exec_mode=exec")
	})
}

// fence runs TestFence on database dbURL (psql's) and poolURL (the Go
// side's: the same, with pgx's settings).
func fence(t *testing.T, dbURL, poolURL string) {
	pool := newPool(t, poolURL)
	a, b := newBackend(t, pool, 2*time.Second), newBackend(t, newPool(t, poolURL), 2*time.Second)
	mustExec(t, pool, "CREATE TABLE report_runs (lease text, token bigint, note text)")
	lease := testkit.Unique("fence")
	write := func(term baton.Term, note string) error {
		return postgres.Fenced(context.Background(), pool, "", term, func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), "INSERT INTO report_runs VALUES ($1, $2, $3)", lease, int64(term.Token()), note)
			return err
		})
	}
	ta := testkit.Campaign(t, a, lease, "a")
	if err := write(ta, "a current"); err != nil {
		t.Fatalf("the holder's fenced write: %v", err)
	}
	job := func(token uint64, note string) error {
		cmd := exec.Command(filepath.Join("testdata", "fenced-job.sh"))
		psqlDir := testserver.PostgresBin
		cmd.Env = append(os.Environ(), "PATH="+psqlDir+":"+os.Getenv("PATH"), "DATABASE_URL="+dbURL,
			"BATON_LEASE="+lease, "BATON_TOKEN="+strconv.FormatUint(token, 10), "NOTE="+note)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return errors.New(strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := job(ta.Token(), "a psql current"); err != nil {
		t.Fatalf("the holder's psql job: %v", err)
	}
	if err := ta.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Released: no term is current, so the old token is refused too.
	if err := write(ta, "a released"); !errors.Is(err, postgres.ErrFenced) || !postgres.IsFenced(err) {
		t.Fatalf("a released term's fenced write: %v; want ErrFenced", err)
	}
	tb := testkit.Campaign(t, b, lease, "b")
	if err := write(ta, "a stale"); !errors.Is(err, postgres.ErrFenced) {
		t.Fatalf("a replaced term's fenced write: %v; want ErrFenced", err)
	}
	if err := job(ta.Token(), "a psql stale"); err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("a replaced term's psql job: %v; want refused by the fence", err)
	}
	if err := write(tb, "b current"); err != nil {
		t.Fatalf("the new holder's fenced write: %v", err)
	}
	// The Term's own Fence method.
	ft, ok := tb.(postgres.FenceTerm)
	if !ok {
		t.Fatalf("%T is not a postgres.FenceTerm", tb)
	}
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := ft.Fence(context.Background(), tx); err != nil {
		t.Fatalf("FenceTerm.Fence: %v", err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "SELECT count(*) FROM report_runs WHERE note LIKE '%stale' OR note LIKE '%released'"); n != 0 {
		t.Errorf("%d stale writes committed", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM report_runs"); n != 3 {
		t.Errorf("%d writes committed, want the 3 current ones", n)
	}
}
