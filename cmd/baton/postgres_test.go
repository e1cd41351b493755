package main

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/testserver"
)

// pgURL returns a postgres:// URL of a database of the test's own on the
// shared test cluster, as its superuser.
func pgURL(t *testing.T) string {
	return testserver.SharedPostgres(t).NewDatabase(t)
}

// pgBouncerURL returns a postgres:// URL of a database of the test's own,
// through a PgBouncer in transaction-pooling mode.
func pgBouncerURL(t *testing.T) string {
	pg := testserver.SharedPostgres(t)
	db := pg.NewDatabase(t)
	return testserver.StartPgBouncer(t, pg).Via(db)
}

// withParam adds query parameter k=v to a URL.
func withParam(t *testing.T, raw, k, v string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestPostgresSchemaMissing: a role that may not create baton's schema
// gets exit 2 and the DDL to apply, never a campaign retried as an
// outage; once a DBA applied what `baton postgres schema` prints, with its
// GRANTs, the same role runs. The password shows nowhere.
func TestPostgresSchemaMissing(t *testing.T) {
	t.Parallel()
	pg := testserver.SharedPostgres(t)
	admin := pg.NewDatabase(t)
	u, _ := url.Parse(admin)
	db := strings.TrimPrefix(u.Path, "/")
	role, pw := pg.NewRole(t)
	// A LOGIN role has CONNECT on a new database, and no CREATE on it.
	app := pg.URLAs(role, pw, db)
	args := []string{"run", "--backend", app, "--lease", "schema", "--timeout", "30s", "--once", "--", "true"}
	r := runApp(t.Context(), nil, args...)
	checkUsageError(t, r, []string{`schema "baton"`, "may not create them", "baton postgres schema", "CREATE TABLE IF NOT EXISTS baton.leases", "CREATE OR REPLACE FUNCTION baton.fence"})
	if strings.Contains(r.stderr, pw) {
		t.Errorf("stderr holds the role's password:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "retrying") {
		t.Errorf("the missing schema was retried as an outage:\n%s", r.stderr)
	}

	// baton_create=false refuses even a role that may create it.
	r = runApp(t.Context(), nil, "run", "--backend", withParam(t, admin, "baton_create", "false"), "--lease", "schema", "--timeout", "30s", "--once", "--", "true")
	checkUsageError(t, r, []string{"NoCreate", "CREATE SCHEMA IF NOT EXISTS baton"})

	// The DBA applies the printed DDL and GRANTs.
	r = runApp(t.Context(), nil, "postgres", "schema", "--role", role)
	if r.code != 0 {
		t.Fatalf("postgres schema: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if _, err := pg.SQL(db, r.stdout); err != nil {
		t.Fatalf("applying the printed DDL and GRANTs: %v", err)
	}
	r = runApp(t.Context(), nil, args...)
	if r.code != 0 {
		t.Fatalf("run as the granted role: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	// The granted role may not change the schema.
	if _, err := pg.SQL(db, "SET ROLE "+role+"; DROP TABLE baton.leases"); err == nil {
		t.Error("the baton role could drop baton.leases: the GRANTs are not least-privilege")
	}
}

// TestPostgresBadCredentials: a wrong password or database is exit 2, told
// once, and neither the password nor a retry shows.
func TestPostgresBadCredentials(t *testing.T) {
	t.Parallel()
	pg := testserver.SharedPostgres(t)
	good := pg.NewDatabase(t)
	const wrong = "WrongPassword1234"
	u, _ := url.Parse(good)
	u.User = url.UserPassword("postgres", wrong)
	for _, tc := range []struct{ name, url string }{
		{"wrong password", u.String()},
		{"wrong password in a parameter", withParam(t, strings.Replace(good, ":"+pg.Password()+"@", "@", 1), "password", wrong)},
		{"no such database", strings.Replace(good, "/t_", "/nosuch_", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range [][]string{
				{"run", "--once", "--timeout", "30s", "--", "true"},
				{"leader", "--timeout", "30s"},
				{"is-leader", "--timeout", "30s"},
			} {
				args := append([]string{cmd[0], "--backend", tc.url, "--lease", "creds", "--log-level", "debug"}, cmd[1:]...)
				r := runApp(t.Context(), nil, args...)
				checkUsageError(t, r, []string{"check the URL's user, password"})
				for _, secret := range []string{wrong, pg.Password()} {
					if strings.Contains(r.stderr, secret) {
						t.Errorf("%s: stderr holds a password:\n%s", cmd[0], r.stderr)
					}
				}
			}
		})
	}
}

// TestPostgresLeaderNotifications: `baton leader` through PgBouncer in
// transaction-pooling mode says that waiters poll, and why; on a direct
// connection it says nothing, and its JSON says "listen".
func TestPostgresLeaderNotifications(t *testing.T) {
	t.Parallel()
	direct := pgURL(t)
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg).Via(direct)
	for _, tc := range []struct {
		name, url, mode, stderr string
	}{
		{"direct", direct, "listen", ""},
		{"pgbouncer", bouncer, "poll", "notifications are off: waiters poll every"},
		{"baton_listen off", withParam(t, direct, "baton_listen", "off"), "poll", "NoListen"},
		// A direct baton_listen beside PgBouncer: waiters wake at once.
		{"pgbouncer with baton_listen", withParam(t, bouncer, "baton_listen", direct), "listen", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runApp(t.Context(), nil, "leader", "--backend", tc.url, "--lease", "notes", "--timeout", "60s", "--json")
			if r.code != 1 {
				t.Fatalf("leader: exit %d, want 1 (nobody leads); stderr:\n%s", r.code, r.stderr)
			}
			var got leaderJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("leader --json: %q: %v", r.stdout, err)
			}
			if got.Notifications != tc.mode {
				t.Errorf("notifications = %q (%s), want %q", got.Notifications, got.NotificationsReason, tc.mode)
			}
			if tc.stderr == "" && strings.Contains(r.stderr, "notifications") {
				t.Errorf("stderr speaks of notifications on a direct connection:\n%s", r.stderr)
			}
			if !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("stderr does not say %q:\n%s", tc.stderr, r.stderr)
			}
			if strings.Contains(r.stderr, pg.Password()) || strings.Contains(r.stdout, pg.Password()) {
				t.Errorf("output holds the password:\n%s%s", r.stdout, r.stderr)
			}
		})
	}
}

// TestPostgresSchemaCommand: `baton postgres schema` prints the backend's
// DDL and GRANTs, and refuses names it could not print unquoted.
func TestPostgresSchemaCommand(t *testing.T) {
	t.Parallel()
	r := runApp(t.Context(), nil, "postgres", "schema", "--schema", "ops", "--role", "app", "--fencer", "jobs")
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{postgres.SchemaSQL("ops"), postgres.GrantSQL("ops", "app", "jobs")} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks:\n%s\ngot:\n%s", want, r.stdout)
		}
	}
	r = runApp(t.Context(), nil, "postgres", "schema", "--schema", "Ops", "--role", "app; DROP TABLE x")
	checkUsageError(t, r, []string{`--schema "Ops"`, "plain SQL identifier", `--role "app; DROP TABLE x"`})
}

// TestPostgresPasswordNotLogged: a run whose URL carries the password as a
// parameter, and a baton_listen with its own, logs neither at debug level.
func TestPostgresPasswordNotLogged(t *testing.T) {
	t.Parallel()
	pg := testserver.SharedPostgres(t)
	direct := pg.NewDatabase(t)
	noPass := strings.Replace(direct, ":"+pg.Password()+"@", "@", 1)
	u := withParam(t, withParam(t, noPass, "password", pg.Password()), "baton_listen", direct)
	r := runApp(t.Context(), nil, "run", "--backend", u, "--lease", "quiet", "--log-level", "debug", "--timeout", "30s", "--once", "--", "true")
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "campaigning") {
		t.Fatalf("no campaigning line at debug level, which names the backend:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr+r.stdout, pg.Password()) {
		t.Errorf("the password shows:\n%s", r.stderr)
	}
}
