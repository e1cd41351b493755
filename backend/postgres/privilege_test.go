package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5"
)

// TestLeastPrivilege: a role without DDL rights gets a *SchemaError
// (a *baton.ConfigError, without its password) naming the DDL; once a DBA
// applied SchemaSQL and GrantSQL, the same role campaigns, and a fencer
// role may fence but not move a lease.
func TestLeastPrivilege(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	db := strings.TrimPrefix(mustURL(t, dbURL).Path, "/")
	role, rolePW := pg.NewRole(t)
	fencer, fencerPW := pg.NewRole(t)
	roleURL, fencerURL := pg.URLAs(role, rolePW, db), pg.URLAs(fencer, fencerPW, db)

	_, err := postgres.New(context.Background(), newPool(t, roleURL), postgres.Options{})
	var se *postgres.SchemaError
	if !errors.As(err, &se) || !errors.As(err, new(*baton.ConfigError)) {
		t.Fatalf("New as a role that may not create the schema: %v; want a *SchemaError and *baton.ConfigError", err)
	}
	if !strings.Contains(se.DDL, "CREATE TABLE IF NOT EXISTS baton.leases") || strings.Contains(err.Error(), rolePW) {
		t.Errorf("SchemaError: %q, DDL %q", err, se.DDL)
	}
	t.Logf("New: %v", err)

	admin := newPool(t, dbURL)
	mustExec(t, admin, postgres.SchemaSQL(""))
	mustExec(t, admin, postgres.GrantSQL("", role, fencer))

	b, err := postgres.New(context.Background(), newPool(t, roleURL), postgres.Options{Config: backend.Config{TTL: time.Second}})
	if err != nil {
		t.Fatalf("New with the granted role: %v", err)
	}
	defer b.Close(context.Background())
	lease := testkit.Unique("priv")
	term := testkit.Campaign(t, b, lease, "a")
	st := testkit.StateTerm(t, term)
	if err := st.StoreState(context.Background(), []byte("x")); err != nil {
		t.Fatalf("StoreState with the granted role: %v", err)
	}
	mustExec(t, admin, "CREATE TABLE jobs (token bigint)")
	mustExec(t, admin, "GRANT INSERT ON jobs TO "+fencer)
	fp := newPool(t, fencerURL)
	err = postgres.Fenced(context.Background(), fp, "", term, func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), "INSERT INTO jobs VALUES ($1)", int64(term.Token()))
		return err
	})
	if err != nil {
		t.Fatalf("the fencer role's fenced write: %v", err)
	}
	if _, err := fp.Exec(context.Background(), "UPDATE baton.leases SET token = token + 1"); err == nil {
		t.Errorf("the fencer role may update baton.leases")
	}
	if err := term.Resign(context.Background()); err != nil {
		t.Fatalf("Resign with the granted role: %v", err)
	}

	// NoCreate: a missing schema is an error even for a role that may
	// create it.
	_, err = postgres.New(context.Background(), admin, postgres.Options{Schema: "elsewhere", NoCreate: true})
	if !errors.As(err, &se) {
		t.Errorf("New with NoCreate and no schema: %v; want a *SchemaError", err)
	}
}

func mustURL(t testing.TB, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestNoPasswordInErrorsOrLogs: the password of the connection string
// shows in no error (a refused login, an unreachable server, a bad URL
// parameter) and in no log line, at Debug, of a Backend cut off from its
// server.
func TestNoPasswordInErrorsOrLogs(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	const wrong = "Wr0ng-pa55word-7731"
	u := mustURL(t, dbURL)
	u.User = url.UserPassword("postgres", wrong)
	errs := map[string]error{}
	_, errs["wrong password"] = postgres.New(context.Background(), newPool(t, u.String()), postgres.Options{})
	_, errs["no server"] = postgres.New(context.Background(), newPool(t, withHost(t, u.String(), "127.0.0.1:1")), postgres.Options{})
	_, errs["bad parameter"] = postgres.ParseURL(u.String() + "&baton_schema=Bad-Name&baton_listen=%25zz")
	_, errs["bad URL"] = postgres.ParseURL("postgres://postgres:" + wrong + "@127.0.0.1:%zz/db")
	for what, err := range errs {
		if err == nil {
			t.Errorf("%s: no error", what)
			continue
		}
		t.Logf("%s: %v", what, err)
		if strings.Contains(err.Error(), wrong) {
			t.Errorf("%s: the error holds the password: %v", what, err)
		}
	}

	var logs bytes.Buffer
	var mu = make(chan struct{}, 1)
	w := writerFunc(func(p []byte) (int, error) { mu <- struct{}{}; defer func() { <-mu }(); return logs.Write(p) })
	proxy := testserver.StartProxy(t, mustURL(t, dbURL).Host)
	b, err := postgres.New(context.Background(), newPool(t, withHost(t, dbURL, proxy.Addr())), postgres.Options{
		Config: backend.Config{TTL: time.Second},
		Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	term := testkit.Campaign(t, b, testkit.Unique("pw"), "a")
	proxy.Cut()
	testkit.WaitDone(t, term, 30*time.Second)
	read := func() string {
		mu <- struct{}{}
		defer func() { <-mu }()
		return logs.String()
	}
	// The connection errors are what could hold a password.
	testkit.Eventually(t, 30*time.Second, "a logged renewal failure", func() bool {
		return strings.Contains(read(), "renewal failed")
	})
	proxy.Heal()
	_ = b.Close(context.Background())
	if got := read(); strings.Contains(got, pg.Password()) {
		t.Errorf("the logs hold the password:\n%s", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestParseURL: baton's parameters are taken out of the URL before pgx
// reads it.
func TestParseURL(t *testing.T) {
	direct := "postgres://u:p@db1:5432/app?sslmode=disable"
	c, err := postgres.ParseURL("postgres://u:p@bouncer:6432/app?sslmode=verify-full&baton_schema=leases&baton_create=false&baton_listen=" + url.QueryEscape(direct))
	if err != nil {
		t.Fatal(err)
	}
	if c.Options.Schema != "leases" || !c.Options.NoCreate || c.Options.Listen == nil || c.Options.Listen.Host != "db1" {
		t.Errorf("options: %+v", c.Options)
	}
	if _, ok := c.Pool.ConnConfig.RuntimeParams["baton_schema"]; ok || c.Pool.ConnConfig.Host != "bouncer" || c.Pool.ConnConfig.TLSConfig == nil {
		t.Errorf("pool config: host %q, runtime params %v, TLS %v", c.Pool.ConnConfig.Host, c.Pool.ConnConfig.RuntimeParams, c.Pool.ConnConfig.TLSConfig != nil)
	}
	// A host list, as libpq and pgx take it, with baton's parameters.
	c, err = postgres.ParseURL("postgres://u:p@db1:5433,db2/app?baton_schema=leases&sslmode=disable")
	if err != nil {
		t.Fatalf("host list: %v", err)
	}
	if c.Options.Schema != "leases" || len(c.Pool.ConnConfig.Fallbacks) != 1 || c.Pool.ConnConfig.Host != "db1" || c.Pool.ConnConfig.Port != 5433 || c.Pool.ConnConfig.Fallbacks[0].Host != "db2" {
		t.Errorf("host list: schema %q, host %q, fallbacks %+v", c.Options.Schema, c.Pool.ConnConfig.Host, c.Pool.ConnConfig.Fallbacks)
	}
	var ce *baton.ConfigError
	if _, err := postgres.ParseURL("postgres://u:p@h/db?baton_create=maybe"); !errors.As(err, &ce) {
		t.Errorf("bad baton_create: %v; want a *baton.ConfigError", err)
	}
	if c, err := postgres.ParseURL("postgres://u:p@h/db?baton_listen=off"); err != nil || !c.Options.NoListen || c.Options.Listen != nil {
		t.Errorf("baton_listen=off: %+v, %v; want NoListen", c.Options, err)
	}
	// Refused, naming what is wrong, never the password (a host list
	// included, which url.Parse cannot read to redact it).
	const pw = "Hunter2Secret"
	for _, tc := range []struct{ raw, want string }{
		{"postgres://u:" + pw + "@h/db?baton_schema=a&baton_schema=b", "baton_schema given 2 times"},
		{"postgres://u:" + pw + "@h/db?baton_scheme=a", "baton's own parameters are baton_schema"},
		{"postgres://u:" + pw + "%zz@h1:5432,h2/db", "malformed % escape"},
		{"postgres://u:" + pw + "@h1:5432,h2:x/db", "h2"},
		{"postgres://u@h1,h2/db?password=" + pw + "&sslmode=sometimes", "sslmode"},
		{"postgres://u:p@h/db?baton_listen=" + url.QueryEscape("postgres://u:"+pw+"@d:bad/db"), "baton_listen"},
		{"postgres://u:p@h/db?baton_listen=" + url.QueryEscape("postgres://u@d/db?baton_schema=x"), "belongs on the main URL"},
	} {
		_, err := postgres.ParseURL(tc.raw)
		if err == nil || !errors.As(err, &ce) {
			t.Errorf("ParseURL(%q) = %v; want a *baton.ConfigError", tc.raw, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q) = %q; want it to say %q", tc.raw, err, tc.want)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("ParseURL(%q) error holds the password: %q", tc.raw, err)
		}
	}
}

// TestSchemaWithoutReservationsIsUpgraded: a schema made by an older
// baton has no reservation columns on baton.leases (a release keeps the
// free lease for the queue head it woke in them). A role that may alter the
// table adds them as it starts; one that may not gets a *SchemaError whose
// DDL adds them, and a DBA's run of that DDL lets it start.
func TestSchemaWithoutReservationsIsUpgraded(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	db := strings.TrimPrefix(mustURL(t, dbURL).Path, "/")
	role, rolePW := pg.NewRole(t)
	fencer, _ := pg.NewRole(t)
	admin := newPool(t, dbURL)
	older := func() {
		mustExec(t, admin, postgres.SchemaSQL(""))
		mustExec(t, admin, "ALTER TABLE baton.leases DROP COLUMN reserved_for, DROP COLUMN reserved_until")
	}
	older()
	mustExec(t, admin, postgres.GrantSQL("", role, fencer))

	_, err := postgres.New(context.Background(), newPool(t, pg.URLAs(role, rolePW, db)), postgres.Options{})
	var se *postgres.SchemaError
	if !errors.As(err, &se) || !strings.Contains(se.DDL, "ADD COLUMN IF NOT EXISTS reserved_until") {
		t.Fatalf("New as a role that may not alter the older schema: %v; want a *SchemaError whose DDL adds the reservation columns", err)
	}
	t.Logf("New as the role: %v", err)

	b, err := postgres.New(context.Background(), admin, postgres.Options{Config: backend.Config{TTL: time.Second}})
	if err != nil {
		t.Fatalf("New as the schema's owner: %v", err)
	}
	defer b.Close(context.Background())
	term := testkit.Campaign(t, b, testkit.Unique("upgraded"), "a")
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(t, admin, "SELECT count(*)::int FROM information_schema.columns WHERE table_schema = 'baton' AND table_name = 'leases' AND column_name IN ('reserved_for', 'reserved_until')"); n != 2 {
		t.Errorf("%d reservation columns after the owner's start, want 2", n)
	}
	rb, err := postgres.New(context.Background(), newPool(t, pg.URLAs(role, rolePW, db)), postgres.Options{})
	if err != nil {
		t.Fatalf("New as the role once the columns exist: %v", err)
	}
	_ = rb.Close(context.Background())
}
