package backendurl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPostgresURL: libpq's URL forms parse as pgx takes them, with baton's
// own parameters taken out before pgx sees them.
func TestPostgresURL(t *testing.T) {
	for _, v := range []string{"PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSSLMODE", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE", "PGCONNECT_TIMEOUT"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	t.Run("host list", func(t *testing.T) {
		spec, err := Parse("postgresql://app:s3cret@db1:5433,db2,[::1]:5434/jobs?sslmode=disable&baton_schema=ops&application_name=x")
		if err != nil {
			t.Fatal(err)
		}
		if spec.Scheme != "postgres" {
			t.Errorf("Scheme = %q, want postgres", spec.Scheme)
		}
		if got := strings.Join(spec.Hosts, " "); got != "db1 db2 ::1" {
			t.Errorf("Hosts = %q, want db1 db2 ::1", got)
		}
		cfg, opts, _, err := postgresConfig("postgres://app:s3cret@db1:5433,db2/jobs?sslmode=disable&baton_schema=ops&application_name=x")
		if err != nil {
			t.Fatal(err)
		}
		c := cfg.ConnConfig
		if c.Host != "db1" || c.Port != 5433 || c.User != "app" || c.Password != "s3cret" || c.Database != "jobs" {
			t.Errorf("config host %q port %d user %q password %q db %q", c.Host, c.Port, c.User, c.Password, c.Database)
		}
		if len(c.Fallbacks) == 0 || c.Fallbacks[len(c.Fallbacks)-1].Host != "db2" || c.Fallbacks[len(c.Fallbacks)-1].Port != 5432 {
			t.Errorf("fallbacks %+v: want db2:5432 last", c.Fallbacks)
		}
		if _, ok := c.RuntimeParams["baton_schema"]; ok {
			t.Error("baton's baton_schema= reached pgx as a run-time parameter: the server would refuse it")
		}
		if c.RuntimeParams["application_name"] != "x" {
			t.Errorf("application_name = %q: libpq's parameters must reach pgx", c.RuntimeParams["application_name"])
		}
		if opts.Schema != "ops" {
			t.Errorf("schema = %q, want ops", opts.Schema)
		}
	})
	t.Run("password parameter", func(t *testing.T) {
		cfg, _, _, err := postgresConfig("postgres://app@db/jobs?password=p%26w&sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ConnConfig.Password != "p&w" {
			t.Errorf("password %q, want p&w", cfg.ConnConfig.Password)
		}
	})
	t.Run("environment and passfile", func(t *testing.T) {
		pass := filepath.Join(t.TempDir(), "pgpass")
		if err := os.WriteFile(pass, []byte("envhost:6000:envdb:envuser:frompassfile\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("PGHOST", "envhost")
		t.Setenv("PGPORT", "6000")
		t.Setenv("PGUSER", "envuser")
		t.Setenv("PGDATABASE", "envdb")
		t.Setenv("PGSSLMODE", "disable")
		t.Setenv("PGPASSFILE", pass)
		spec, err := Parse("postgres://")
		if err != nil {
			t.Fatal(err)
		}
		if len(spec.Hosts) != 1 || spec.Hosts[0] != "envhost" {
			t.Errorf("Hosts = %q, want PGHOST's envhost", spec.Hosts)
		}
		cfg, _, _, err := postgresConfig("postgres://")
		if err != nil {
			t.Fatal(err)
		}
		if c := cfg.ConnConfig; c.Port != 6000 || c.User != "envuser" || c.Database != "envdb" || c.Password != "frompassfile" {
			t.Errorf("from the environment: port %d user %q db %q password %q", c.Port, c.User, c.Database, c.Password)
		}
		// The URL's password wins over the passfile's.
		cfg, _, _, err = postgresConfig("postgres://envuser:fromurl@")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ConnConfig.Password != "fromurl" {
			t.Errorf("password %q, want the URL's", cfg.ConnConfig.Password)
		}
	})
	t.Run("verify-full", func(t *testing.T) {
		cfg, _, _, err := postgresConfig("postgres://db.example.com/jobs?sslmode=verify-full")
		if err != nil {
			t.Fatal(err)
		}
		tc := cfg.ConnConfig.TLSConfig
		if tc == nil || tc.InsecureSkipVerify || tc.ServerName != "db.example.com" {
			t.Errorf("sslmode=verify-full: TLS config %+v, want verification of db.example.com", tc)
		}
	})
	t.Run("baton_listen", func(t *testing.T) {
		if _, err := Parse("postgres://app:pw@bouncer:6432/jobs?baton_listen=postgres://app@db:5432/jobs%3Fsslmode%3Ddisable"); err != nil {
			t.Fatal(err)
		}
		if _, err := Parse("postgres://app:pw@bouncer:6432/jobs?baton_listen=off"); err != nil {
			t.Fatal(err)
		}
		// The listen URL's password defaults to the main URL's; its own wins.
		_, opts, _, err := postgresConfig("postgres://app:pw@bouncer:6432/jobs?baton_listen=postgres://app@db:5432/jobs%3Fsslmode%3Ddisable")
		if err != nil {
			t.Fatal(err)
		}
		if opts.Listen == nil || opts.Listen.Host != "db" || opts.Listen.Password != "pw" {
			t.Errorf("listen config %+v: want host db with the main URL's password", opts.Listen)
		}
		_, opts, _, err = postgresConfig("postgres://app:pw@bouncer:6432/jobs?baton_listen=postgres://app:own@db:5432/jobs")
		if err != nil {
			t.Fatal(err)
		}
		if opts.Listen == nil || opts.Listen.Password != "own" {
			t.Errorf("listen config %+v: want its own password", opts.Listen)
		}
		if _, opts, _, err = postgresConfig("postgres://app:pw@bouncer:6432/jobs?baton_listen=off"); err != nil || !opts.NoListen {
			t.Errorf("baton_listen=off: NoListen %v, err %v", opts.NoListen, err)
		}
	})
}

// TestPostgresURLErrors: a bad postgres:// URL is refused before anything
// connects, with a message naming what is wrong and the form, and never the
// password.
func TestPostgresURLErrors(t *testing.T) {
	const pw = "Hunter2Secret"
	for _, tc := range []struct{ raw, want string }{
		{"postgres://app:" + pw + "@db:notaport/jobs", "invalid port"},
		{"postgres://app:" + pw + "@db:99999/jobs", "port"},
		{"postgres://app:" + pw + "@db/jobs?sslmode=sometimes", "sslmode"},
		{"postgres://app:" + pw + "@db/jobs?baton_schema=Ops", "baton_schema=Ops"},
		{"postgres://app:" + pw + "@db/jobs?baton_create=maybe", "baton_create"},
		{"postgres://app:" + pw + "@db/jobs?baton_scheme=x", "baton's own parameters are baton_schema, baton_listen, baton_create"},
		{"postgres://app:" + pw + "@db/jobs?schema=x", "baton_schema"},
		{"postgres://app:" + pw + "@db/jobs?baton_listen=http://db", "baton_listen"},
		{"postgres://app:" + pw + "@db/jobs?baton_listen=postgres://app:" + pw + "@db:bad/jobs", "baton_listen"},
		{"postgres://app:" + pw + "%zz@db/jobs", "malformed % escape"},
		{"postgres://app@db/jobs?password=" + pw + "&sslmode=bad", "sslmode"},
		{"postgres://app:" + pw + "@db/jobs?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", "ca.pem"},
		{"postgres://app:" + pw + "@db/jobs#frag", "%23"},
	} {
		_, err := Parse(tc.raw)
		if err == nil {
			t.Errorf("Parse(%q) succeeded", tc.raw)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) {
			t.Errorf("Parse(%q) = %q, want it to say %q", tc.raw, msg, tc.want)
		}
		if strings.Contains(msg, pw) {
			t.Errorf("Parse(%q) error holds the password: %q", tc.raw, msg)
		}
	}
}

// TestRedactPostgres: Redact hides the user-information password, the
// password parameters and a baton_listen's password.
func TestRedactPostgres(t *testing.T) {
	const pw = "Hunter2Secret"
	for _, raw := range []string{
		"postgres://app:" + pw + "@db/jobs",
		"postgres://app@db/jobs?sslmode=disable&password=" + pw,
		"postgres://app@db/jobs?sslpassword=" + pw,
		"postgres://app@db/jobs?baton_listen=postgres://app:" + pw + "@direct/jobs",
		"postgres://app@db/jobs?baton_listen=postgres%3A%2F%2Fapp%3A" + pw + "%40direct%2Fjobs",
	} {
		got := Redact(raw)
		if strings.Contains(got, pw) {
			t.Errorf("Redact(%q) = %q: the password shows", raw, got)
		}
		if !strings.Contains(got, "xxxxx") {
			t.Errorf("Redact(%q) = %q: no mask", raw, got)
		}
	}
}
