package postgres_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
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

// childEnv runs the test binary as a lease holder (see childMain): its
// value is the mode, "after-fence" or "before-fence".
const childEnv = "BATON_PG_TEST_CHILD"

// childMain is a holder process: it takes the lease BATON_LEASE on
// DATABASE_URL with TTL BATON_TTL, prints "token N", and then, in mode
// after-fence, opens a transaction, fences it and prints "fenced"; in
// mode before-fence, prints "ready". Either way it then waits for a line
// on stdin (the test pauses it meanwhile), writes a row of its token into
// writes in that transaction (before-fence: a new fenced one) and commits,
// and prints "committed" or "refused: ERR".
func childMain(mode string) int {
	if mode == "queue" {
		return queueChildMain()
	}
	ctx := context.Background()
	fail := func(err error) int { fmt.Println("error:", err); return 1 }
	ttl, err := time.ParseDuration(os.Getenv("BATON_TTL"))
	if err != nil {
		return fail(err)
	}
	lease := os.Getenv("BATON_LEASE")
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return fail(err)
	}
	b, err := postgres.New(ctx, pool, postgres.Options{Config: backend.Config{TTL: ttl}})
	if err != nil {
		return fail(err)
	}
	term, err := b.Campaign(ctx, lease, baton.Candidate{ID: "paused"})
	if err != nil {
		return fail(err)
	}
	fmt.Printf("token %d\n", term.Token())
	in := bufio.NewReader(os.Stdin)
	insert := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO writes (token, who) VALUES ($1, 'paused')", int64(term.Token()))
		return err
	}
	var result error
	switch mode {
	case "after-fence", "in-statement":
		tx, err := pool.Begin(ctx)
		if err != nil {
			return fail(err)
		}
		if err := postgres.Fence(ctx, tx, "", lease, term.Token()); err != nil {
			return fail(err)
		}
		fmt.Println("fenced")
		if mode == "in-statement" {
			// Stopped while this runs on the server (the test waits to
			// see it in pg_stat_activity).
			_, result = tx.Exec(ctx, "SELECT pg_sleep(3600)")
		}
		_, _ = in.ReadString('\n')
		if result == nil {
			result = insert(tx)
		}
		if result == nil {
			result = tx.Commit(ctx)
		}
	default:
		fmt.Println("ready")
		_, _ = in.ReadString('\n')
		result = postgres.Fenced(ctx, pool, "", term, insert)
	}
	if result != nil {
		fmt.Println("refused:", strings.ReplaceAll(result.Error(), "\n", " "))
	} else {
		fmt.Println("committed")
	}
	return 0
}

// TestPausedHolderCannotCommit is the paused-holder attack with real
// processes: a holder process is stopped (SIGSTOP, its whole process
// group) after it fenced its transaction, while a statement of that
// transaction runs on the server (an hour's pg_sleep), or before it
// fenced; a new holder
// takes the lease over and commits a fenced write; the old one is
// continued (SIGCONT) and tries to commit. Its write must not commit, and
// the new holder must not wait for the paused transaction more than about
// the lease's TTL (the fence's idle_in_transaction_session_timeout).
func TestPausedHolderCannotCommit(t *testing.T) {
	for _, mode := range []string{"after-fence", "in-statement", "before-fence"} {
		t.Run(mode, func(t *testing.T) { pausedHolder(t, mode) })
	}
}

func pausedHolder(t *testing.T, mode string) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	pool := newPool(t, dbURL)
	const ttl = time.Second
	nb := newBackend(t, pool, ttl) // creates the schema before the child starts
	mustExec(t, pool, "CREATE TABLE writes (token bigint, who text)")
	lease := testkit.Unique("paused")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "DATABASE_URL="+dbURL, "BATON_LEASE="+lease, "BATON_TTL="+ttl.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the holder process exited while we waited for %s", what)
			}
			return l
		case <-time.After(60 * time.Second):
			t.Fatalf("the holder process did not say %s", what)
		}
		return ""
	}
	line := next("its token")
	old, err := strconv.ParseUint(strings.TrimPrefix(line, "token "), 10, 64)
	if err != nil {
		t.Fatalf("holder: %q", line)
	}
	if l := next("that it is ready"); l != "fenced" && l != "ready" {
		t.Fatalf("holder: %q", l)
	}
	if mode == "in-statement" {
		testkit.Eventually(t, 30*time.Second, "the holder's statement running on the server", func() bool {
			return count(t, pool, "SELECT count(*)::int FROM pg_stat_activity WHERE state = 'active' AND query = 'SELECT pg_sleep(3600)'") == 1
		})
	}
	if err := syscall.Kill(-pgid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	// The new holder campaigns as an Elector would, retrying after a
	// failed attempt; its acquisition may wait for the paused transaction.
	stopped := time.Now()
	// Twenty TTLs is far more than the fence's bound (a TTL of idleness
	// ends the paused transaction), and far less than forever.
	holdUp := 20 * ttl
	var term baton.Term
	for term == nil && time.Since(stopped) < holdUp {
		ctx, cancel := context.WithTimeout(context.Background(), holdUp)
		term, err = nb.Campaign(ctx, lease, baton.Candidate{ID: "new"})
		cancel()
	}
	if term == nil {
		t.Fatalf("the paused holder's transaction kept the new holder out for %s: %v", holdUp, err)
	}
	t.Logf("the new holder won %s after the old one was stopped (TTL %s)", time.Since(stopped).Round(time.Millisecond), ttl)
	if term.Token() <= old {
		t.Fatalf("new token %d not above the paused holder's %d", term.Token(), old)
	}
	err = postgres.Fenced(context.Background(), pool, "", term, func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), "INSERT INTO writes (token, who) VALUES ($1, 'new')", int64(term.Token()))
		return err
	})
	if err != nil {
		t.Fatalf("the new holder's fenced write: %v", err)
	}

	if err := syscall.Kill(-pgid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	res := next("its result")
	t.Logf("the resumed holder: %s", res)
	if !strings.HasPrefix(res, "refused") {
		t.Errorf("the resumed holder: %q; want its write refused", res)
	}
	if mode == "before-fence" && !strings.Contains(res, "fenced") {
		t.Errorf("the resumed holder: %q; want the fence's refusal", res)
	}
	if n := count(t, pool, "SELECT count(*) FROM writes WHERE who = 'paused'"); n != 0 {
		t.Errorf("the paused holder's write committed after the new holder's (%d rows)", n)
	}
	if n := count(t, pool, "SELECT count(*) FROM writes WHERE who = 'new'"); n != 1 {
		t.Errorf("the new holder's write: %d rows, want 1", n)
	}
}
