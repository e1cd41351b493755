package postgres

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/batonhq/baton"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// URL parameters that ParseURL reads for baton and removes before pgx sees
// the connection string (pgx would send unknown parameters to the server
// as settings, which it refuses).
const (
	// ParamSchema is Options.Schema: ?baton_schema=NAME.
	ParamSchema = "baton_schema"
	// ParamListen is a direct connection string for LISTEN
	// (Options.Listen), URL-escaped: ?baton_listen=postgres%3A%2F%2F...
	// Use it when the URL goes through PgBouncer in transaction-pooling
	// mode.
	ParamListen = "baton_listen"
	// ParamCreate, set to false, is Options.NoCreate: ?baton_create=false.
	ParamCreate = "baton_create"
)

// URLConfig is what ParseURL reads from a connection string.
type URLConfig struct {
	// Pool is the pool's configuration, as pgxpool.ParseConfig reads it
	// (libpq's URL and keyword/value forms, host lists, sslmode up to
	// verify-full, the PG* environment variables, passfile).
	Pool *pgxpool.Config
	// Options holds Schema, Listen and NoCreate from baton's parameters;
	// the caller sets the rest (TTL, Logger, ...).
	Options Options
}

// ParseURL reads a postgres:// or postgresql:// connection string (or a
// libpq keyword/value string) and baton's own parameters (ParamSchema,
// ParamListen, ParamCreate). Its errors never hold the password: they
// name the parameter that is wrong and how to fix it, and match
// *baton.ConfigError.
func ParseURL(raw string) (URLConfig, error) {
	var (
		out      URLConfig
		problems []string
	)
	conn := raw
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		// Only the query is parsed here: the authority may be a host list
		// (h1:5432,h2:5433), which url.Parse refuses and pgx reads.
		base, query, _ := strings.Cut(raw, "?")
		q, err := url.ParseQuery(query)
		if err != nil {
			return out, &baton.ConfigError{Problems: []string{"postgres: the connection string's parameters (after ?) are not valid URL query syntax: " + redactURLError(err)}}
		}
		if v, ok := q[ParamSchema]; ok {
			out.Options.Schema = v[0]
			if err := checkSchema(v[0]); err != nil {
				problems = append(problems, "postgres: "+ParamSchema+": "+err.Error())
			}
		}
		if v, ok := q[ParamCreate]; ok {
			create, err := strconv.ParseBool(v[0])
			if err != nil {
				problems = append(problems, fmt.Sprintf("postgres: %s=%q: want true or false", ParamCreate, v[0]))
			}
			out.Options.NoCreate = !create
		}
		if v, ok := q[ParamListen]; ok {
			lc, err := pgx.ParseConfig(v[0])
			if err != nil {
				problems = append(problems, "postgres: "+ParamListen+": not a connection string pgx can use: "+redactConfigError(err, v[0]))
			} else {
				out.Options.Listen = lc
			}
		}
		q.Del(ParamSchema)
		q.Del(ParamCreate)
		q.Del(ParamListen)
		conn = base
		if len(q) > 0 {
			conn += "?" + q.Encode()
		}
	} else if strings.Contains(raw, "baton_") {
		problems = append(problems, "postgres: baton's parameters ("+ParamSchema+", "+ParamListen+", "+ParamCreate+") are read from the postgres:// URL form only; write the connection string as a URL")
	}
	pc, err := pgxpool.ParseConfig(conn)
	if err != nil {
		problems = append(problems, "postgres: the connection string: "+redactConfigError(err, conn))
	}
	if len(problems) > 0 {
		return URLConfig{}, &baton.ConfigError{Problems: problems}
	}
	out.Pool = pc
	return out, nil
}

// redactConfigError returns err's message with the password of conn, if
// any, removed. pgx already masks it; this holds should that change.
func redactConfigError(err error, conn string) string {
	msg := err.Error()
	if u, perr := url.Parse(conn); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			msg = redact(msg, pw)
			msg = redact(msg, url.QueryEscape(pw))
		}
	}
	return msg
}

// redactURLError returns a url.Parse error without the URL, which holds the
// password.
func redactURLError(err error) string {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err.Error()
	}
	return "malformed URL"
}
