package testserver

import (
	"strings"
	"testing"
)

// TestPostgresAndPgBouncer starts a cluster and a PgBouncer in front of it,
// and checks that the server runs unprivileged, answers on its own address
// and through PgBouncer, and comes back empty after a wipe.
func TestPostgresAndPgBouncer(t *testing.T) {
	pg := StartPostgres(t)
	out, err := pg.SQL("postgres", "SHOW server_version_num")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "15") {
		t.Errorf("server_version_num = %q, want PostgreSQL 15", out)
	}
	if _, err := pg.SQL("postgres", "CREATE TABLE kept (x int)"); err != nil {
		t.Fatal(err)
	}
	bouncer := StartPgBouncer(t, pg)
	if bouncer.URL("postgres") == pg.URL("postgres") {
		t.Fatal("PgBouncer's URL is the server's")
	}
	if err := pg.Restart(true); err != nil {
		t.Fatalf("restart with wipe: %v", err)
	}
	out, err = pg.SQL("postgres", "SELECT count(*) FROM pg_tables WHERE tablename = 'kept'")
	if err != nil || out != "0" {
		t.Fatalf("after a wipe: %q, %v; want no table", out, err)
	}
}
