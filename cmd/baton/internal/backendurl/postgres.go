package backendurl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
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
// taken out before pgx sees the rest (pgx would send an unknown one to the
// server as a run-time setting, which the server refuses).
var postgresParams = []string{postgres.ParamSchema, postgres.ParamListen, postgres.ParamCreate}

// postgresRetry is the pause between attempts to reach the database when
// the CLI starts: `baton run` keeps trying, the short-lived commands give
// up when their --timeout ends.
const postgresRetry = time.Second

// parsePostgresURL accepts a postgres:// or postgresql:// connection URL as
// libpq and pgx take it (host lists, sslmode up to verify-full, the PG*
// environment variables, passfile, service), plus baton's parameters:
//
//	baton_schema=NAME     the schema of baton's tables (default baton)
//	baton_listen=URL|off  a direct connection for LISTEN when the URL goes
//	                      through PgBouncer in transaction-pooling mode (its
//	                      password defaults to the main URL's); off: poll
//	baton_create=false    never create the schema: refuse to start without it
//
// (postgres.ParseURL reads the same parameters; this parser also takes
// host lists, which net/url refuses, and never hands pgx the password.)
//
// It checks the URL as pgx.ParseConfig does (which reads the PG* variables
// and the passfile, and any certificate files named), without connecting.
// The password is taken out of the URL before pgx parses it, so that no
// error of pgx's can quote it, and set on the parsed configuration.
func parsePostgresURL(raw string) (opener, []string, error) {
	cfg, rest, err := parsePostgresConn(raw, "")
	if err != nil {
		return nil, nil, err
	}
	opts := postgres.Options{}
	for _, k := range postgresParams {
		vs, ok := rest[k]
		if !ok {
			continue
		}
		if len(vs) != 1 {
			return nil, nil, fmt.Errorf("parameter %s given %d times: give it once (%s)", k, len(vs), PostgresForm)
		}
		v := vs[0]
		switch k {
		case postgres.ParamSchema:
			opts.Schema = v
			if err := checkPostgresSchema(v); err != nil {
				return nil, nil, err
			}
		case postgres.ParamCreate:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, nil, fmt.Errorf("%s=%q: want true or false (false: refuse to start when the schema is missing, rather than create it)", k, v)
			}
			opts.NoCreate = !b
		case postgres.ParamListen:
			if v == "off" {
				opts.NoListen = true
				break
			}
			if !strings.HasPrefix(v, "postgres://") && !strings.HasPrefix(v, "postgresql://") {
				return nil, nil, fmt.Errorf("%s: want a postgres:// URL of a direct connection to the server (not through PgBouncer), %%-escaped in the query, or off to poll", k)
			}
			lcfg, lrest, err := parsePostgresConn(v, cfg.ConnConfig.Password)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", k, err)
			}
			for _, k := range postgresParams {
				if _, ok := lrest[k]; ok {
					return nil, nil, fmt.Errorf("%s: parameter %s belongs on the main URL, not on %s", postgres.ParamListen, k, postgres.ParamListen)
				}
			}
			opts.Listen = lcfg.ConnConfig
		}
	}
	var hosts []string
	for _, h := range append([]string{cfg.ConnConfig.Host}, fallbackHosts(cfg.ConnConfig)...) {
		if h == "" || strings.HasPrefix(h, "/") || slices.Contains(hosts, h) {
			continue // a Unix socket's directory, or a host named twice
		}
		if err := CheckHost(h); err != nil {
			return nil, nil, fmt.Errorf("server %q: %v: use %s", h, err, PostgresForm)
		}
		hosts = append(hosts, h)
	}
	return func(ctx context.Context, o Options) (*Backend, error) {
		return openPostgres(ctx, cfg, opts, o)
	}, hosts, nil
}

// parsePostgresConn parses a connection URL with pgx, its password taken
// out first (and defaulting to password when the URL names none, for a
// baton_listen). It returns the configuration and baton's parameters.
func parsePostgresConn(raw, password string) (*pgxpool.Config, url.Values, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	scheme = strings.ToLower(scheme)
	if scheme != "postgres" && scheme != "postgresql" {
		return nil, nil, fmt.Errorf("unknown scheme %q: use %s", scheme, PostgresForm)
	}
	if strings.ContainsAny(raw, "#") {
		return nil, nil, fmt.Errorf("a # in the URL: escape it as %%23 (%s)", PostgresForm)
	}
	// The user information ends at the first @ before any /, as pgx reads it.
	var userinfo string
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		userinfo, rest = rest[:i], rest[i+1:]
	}
	user, pass, hasPass := strings.Cut(userinfo, ":")
	if hasPass {
		p, err := url.PathUnescape(pass)
		if err != nil {
			return nil, nil, fmt.Errorf("the password has a malformed %% escape: write %%25 for a %% and %%40 for an @ in it (%s)", PostgresForm)
		}
		password = p
	}
	authority, query, _ := strings.Cut(rest, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, nil, fmt.Errorf("query: %v: %s (%s)", err, escapeHint, PostgresForm)
	}
	fromQuery := false
	if pw, ok := q["password"]; ok {
		if len(pw) > 0 {
			password, fromQuery = pw[len(pw)-1], true
		}
		delete(q, "password")
	}
	for k := range q {
		if strings.HasPrefix(k, "baton") && !slices.Contains(postgresParams, k) || k == "schema" || k == "listen_url" {
			return nil, nil, fmt.Errorf("unknown parameter %q: baton's own parameters are %s (%s)", k, strings.Join(postgresParams, ", "), PostgresForm)
		}
	}
	ours := url.Values{}
	for _, k := range postgresParams {
		if v, ok := q[k]; ok {
			ours[k] = v
			delete(q, k)
		}
	}
	clean := scheme + "://"
	if userinfo != "" {
		clean += user + "@"
	}
	clean += authority
	if len(q) > 0 {
		clean += "?" + q.Encode()
	}
	cfg, err := pgxpool.ParseConfig(clean)
	if err != nil {
		return nil, nil, postgresParseError(err, password)
	}
	// The URL's password comes first; else the passfile's or PGPASSWORD's,
	// which pgx found; else, for a baton_listen, the main URL's.
	if password != "" && (hasPass || fromQuery || cfg.ConnConfig.Password == "") {
		cfg.ConnConfig.Password = password
	}
	return cfg, ours, nil
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

// postgresParseError rewords pgx's parse error: its message quotes the
// connection string (which holds no password, as parsePostgresConn takes
// it out), and the password is removed again should it appear anyway.
func postgresParseError(err error, password string) error {
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			msg = msg[i+3:]
		}
	}
	if password != "" {
		msg = strings.ReplaceAll(msg, password, "xxxxx")
	}
	return fmt.Errorf("%s (%s; libpq's parameters as pgx takes them, and baton's %s)", msg, PostgresForm, strings.Join(postgresParams, ", "))
}

// checkPostgresSchema is the backend's schema-name rule (SchemaSQL's), in
// the words of a URL user.
func checkPostgresSchema(name string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s=%s: %s (%s)", postgres.ParamSchema, name, strings.TrimPrefix(fmt.Sprint(r), "postgres: "), PostgresForm)
		}
	}()
	postgres.SchemaSQL(name)
	return nil
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
