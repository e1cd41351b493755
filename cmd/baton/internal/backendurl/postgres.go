package backendurl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresForm shows how postgres:// URLs are written, for messages.
const PostgresForm = "postgres://[user[:password]@]host[:port][,host[:port]...][/database][?param=value&...]"

// postgresParams are baton's own query parameters of a postgres:// URL,
// which postgres.ParseURL takes out before pgx sees the rest.
var postgresParams = []string{postgres.ParamSchema, postgres.ParamListen, postgres.ParamCreate}

// postgresRetry is the pause between attempts to reach the database when
// the CLI starts: `baton run` keeps trying, the short-lived commands give
// up when their --timeout ends.
const postgresRetry = time.Second

// parsePostgresURL accepts a postgres:// or postgresql:// connection URL as
// postgres.ParseURL reads it (libpq's URL as pgx takes it: host lists,
// sslmode up to verify-full, the PG* environment variables, passfile,
// service; and baton's parameters):
//
//	baton_schema=NAME     the schema of baton's tables (default baton)
//	baton_listen=URL|off  a direct connection for LISTEN when the URL goes
//	                      through PgBouncer in transaction-pooling mode; off: poll
//	baton_create=false    never create the schema: refuse to start without it
//
// On top of it, the CLI's own rules: every host must be one a client can
// dial (CheckHost); baton_listen must be a postgres:// URL, and its
// password defaults to the main URL's; schema= and listen_url= (other
// tools' names) and a # get a hint. It reads the PG* variables and the
// passfile, and any certificate files named, without connecting.
func parsePostgresURL(raw string) (opener, []string, error) {
	cfg, opts, hosts, err := postgresConfig(raw)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, o Options) (*Backend, error) {
		return openPostgres(ctx, cfg, opts, o)
	}, hosts, nil
}

// postgresConfig is parsePostgresURL's work: the pool's configuration,
// the backend's options from baton's parameters, and the hosts.
func postgresConfig(raw string) (*pgxpool.Config, postgres.Options, []string, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	scheme = strings.ToLower(scheme)
	if scheme != "postgres" && scheme != "postgresql" {
		return nil, postgres.Options{}, nil, fmt.Errorf("unknown scheme %q: use %s", scheme, PostgresForm)
	}
	raw = scheme + "://" + rest
	if err := postgresHints(raw); err != nil {
		return nil, postgres.Options{}, nil, err
	}
	uc, err := postgres.ParseURL(raw)
	if err != nil {
		return nil, postgres.Options{}, nil, postgresParseError(err)
	}
	cfg, opts := uc.Pool, uc.Options
	if opts.Listen != nil && opts.Listen.Password == "" {
		// Neither the listen URL nor the passfile or PGPASSWORD gave one.
		opts.Listen.Password = cfg.ConnConfig.Password
	}
	var hosts []string
	for _, h := range append([]string{cfg.ConnConfig.Host}, fallbackHosts(cfg.ConnConfig)...) {
		if h == "" || strings.HasPrefix(h, "/") || slices.Contains(hosts, h) {
			continue // a Unix socket's directory, or a host named twice
		}
		if err := CheckHost(h); err != nil {
			return nil, postgres.Options{}, nil, fmt.Errorf("server %q: %v: use %s", h, err, PostgresForm)
		}
		hosts = append(hosts, h)
	}
	return cfg, opts, hosts, nil
}

// postgresHints refuses, with a hint, what postgres.ParseURL would take
// but a CLI user most likely did not mean: a # (a fragment pgx ignores),
// the parameter names other tools use for baton's, and a baton_listen that
// is not a postgres:// URL.
func postgresHints(raw string) error {
	if strings.Contains(raw, "#") {
		return fmt.Errorf("a # in the URL: escape it as %%23 (%s)", PostgresForm)
	}
	_, query, _ := strings.Cut(raw, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil // postgres.ParseURL says what is wrong with it
	}
	for _, k := range []string{"schema", "listen_url"} {
		if _, ok := q[k]; ok {
			return fmt.Errorf("unknown parameter %q: baton's own parameters are %s (%s)", k, strings.Join(postgresParams, ", "), PostgresForm)
		}
	}
	for _, v := range q[postgres.ParamListen] {
		if v != "off" && !strings.HasPrefix(v, "postgres://") && !strings.HasPrefix(v, "postgresql://") {
			return fmt.Errorf("%s: want a postgres:// URL of a direct connection to the server (not through PgBouncer), %%-escaped in the query, or off to poll", postgres.ParamListen)
		}
	}
	return nil
}

// fallbackHosts returns the hosts of cfg's fallbacks (the URL's host list
// after the first).
func fallbackHosts(cfg *pgx.ConnConfig) []string {
	var hosts []string
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	return hosts
}

// postgresParseError is postgres.ParseURL's error (which holds no
// password) in the CLI's words: its problems, and the URL's form.
func postgresParseError(err error) error {
	msg := err.Error()
	var ce *baton.ConfigError
	if errors.As(err, &ce) {
		msg = strings.Join(ce.Problems, "; ")
	}
	msg = strings.ReplaceAll(msg, "postgres: ", "")
	return fmt.Errorf("%s (%s; libpq's parameters as pgx takes them, and baton's %s)", msg, PostgresForm, strings.Join(postgresParams, ", "))
}

// openPostgres opens a pool on cfg and the backend on it, retrying while
// the database cannot be reached; a refusal that retrying cannot fix (bad
// credentials, no such database, a missing schema baton may not create)
// is a *SettingsError. A missing schema's error holds the DDL to apply.
func openPostgres(ctx context.Context, cfg *pgxpool.Config, opts postgres.Options, o Options) (*Backend, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, settingsErrorf("postgres: %v", redactPassword(err, cfg.ConnConfig.Password))
	}
	opts.Config = backend.Config{TTL: o.TTL}
	opts.Logger = o.Logger
	for attempt := 1; ; attempt++ {
		b, err := postgres.New(ctx, pool, opts)
		if err == nil {
			return &Backend{Backend: b, close: func(ctx context.Context) error {
				defer pool.Close()
				return b.Close(ctx)
			}}, nil
		}
		var se *postgres.SchemaError
		var ce *baton.ConfigError
		switch {
		case errors.As(err, &se):
			pool.Close()
			return nil, settingsErrorf("%v\n\nThe DDL (also printed by `baton postgres schema`):\n\n%s", se, se.DDL)
		case errors.As(err, &ce):
			pool.Close()
			return nil, settingsErrorf("%v", redactPassword(err, cfg.ConnConfig.Password))
		case refusedForGood(err):
			pool.Close()
			return nil, settingsErrorf("postgres: %v: check the URL's user, password (or passfile, PGPASSWORD) and database", redactPassword(err, cfg.ConnConfig.Password))
		}
		if ctx.Err() != nil {
			pool.Close()
			return nil, redactPassword(err, cfg.ConnConfig.Password)
		}
		if o.Logger != nil {
			o.Logger.Warn("database not reachable yet; retrying", "attempt", attempt, "err", redactPassword(err, cfg.ConnConfig.Password))
		}
		select {
		case <-ctx.Done():
			pool.Close()
			return nil, redactPassword(err, cfg.ConnConfig.Password)
		case <-time.After(postgresRetry):
		}
	}
}

// refusedForGood reports whether err is the server's refusal of the
// connection's settings: a password, a role, a database, a privilege.
func refusedForGood(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "28P01", "28000", "3D000", "42501": // invalid_password, invalid_authorization_specification, invalid_catalog_name, insufficient_privilege
		return true
	}
	return false
}

// redactPassword returns err with password removed from its message.
func redactPassword(err error, password string) error {
	if err == nil || password == "" {
		return err
	}
	if msg := err.Error(); strings.Contains(msg, password) {
		return errors.New(strings.ReplaceAll(msg, password, "xxxxx"))
	}
	return err
}

// PostgresMaxTTL is the longest TTL baton.fence can honour: it sets the
// fenced transaction's statement_timeout and
// idle_in_transaction_session_timeout to the TTL in milliseconds, settings
// PostgreSQL bounds by 2^31-1 ms.
const PostgresMaxTTL = math.MaxInt32 * time.Millisecond

// postgresWindow is the renewal window of a PostgreSQL holder at ttl (the
// backend.Config defaults, which the backend runs at), or why ttl is beyond
// PostgresMaxTTL.
func postgresWindow(ttl time.Duration) (time.Duration, error) {
	if ttl > PostgresMaxTTL {
		return 0, fmt.Errorf("above %s, the longest TTL PostgreSQL can honour: baton.fence sets the fenced transaction's statement_timeout to the TTL, and PostgreSQL takes at most 2147483647 ms; use --ttl %s or less", PostgresMaxTTL, PostgresMaxTTL)
	}
	timing, err := (backend.Config{TTL: ttl}).WithDefaults()
	if err != nil {
		return 0, err
	}
	return timing.TTL - timing.RenewInterval - timing.DriftMargin, nil
}
