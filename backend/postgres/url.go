package postgres

import (
	"fmt"
	"net/url"
	"slices"
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
	// mode; ?baton_listen=off is Options.NoListen (waiters poll).
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
	// Options holds Schema, Listen, NoListen and NoCreate from baton's parameters;
	// the caller sets the rest (TTL, Logger, ...).
	Options Options
}

// ParseURL reads a postgres:// or postgresql:// connection string (or a
// libpq keyword/value string) and baton's own parameters (ParamSchema,
// ParamListen, ParamCreate). ParamListen takes a connection string, or
// "off" for Options.NoListen. Its errors never hold the password: they
// name the parameter that is wrong and how to fix it, and match
// *baton.ConfigError.
func ParseURL(raw string) (URLConfig, error) {
	var (
		out      URLConfig
		problems []string
	)
	conn := raw
	passwords := urlPasswords(raw)
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		if _, ok := userinfoPassword(raw); !ok {
			problems = append(problems, "postgres: the password has a malformed % escape: write %25 for a % and %40 for an @ in it")
		}
		// Only the query is parsed here: the authority may be a host list
		// (h1:5432,h2:5433), which url.Parse refuses and pgx reads.
		base, query, _ := strings.Cut(raw, "?")
		q, err := url.ParseQuery(query)
		if err != nil {
			return out, &baton.ConfigError{Problems: []string{"postgres: the connection string's parameters (after ?) are not valid URL query syntax: " + redactURLError(err)}}
		}
		for k, v := range q {
			switch {
			case k == ParamSchema || k == ParamListen || k == ParamCreate:
				if len(v) != 1 {
					problems = append(problems, fmt.Sprintf("postgres: %s given %d times: give it once", k, len(v)))
				}
			case strings.HasPrefix(k, "baton"):
				problems = append(problems, fmt.Sprintf("postgres: unknown parameter %q: baton's own parameters are %s, %s, %s", k, ParamSchema, ParamListen, ParamCreate))
			}
		}
		if v, ok := q[ParamSchema]; ok {
			out.Options.Schema = v[0]
			if err := checkSchema(v[0]); err != nil {
				problems = append(problems, fmt.Sprintf("postgres: %s=%s: %v", ParamSchema, v[0], err))
			}
		}
		if v, ok := q[ParamCreate]; ok {
			create, err := strconv.ParseBool(v[0])
			if err != nil {
				problems = append(problems, fmt.Sprintf("postgres: %s=%q: want true or false (false: refuse to start when the schema is missing, rather than create it)", ParamCreate, v[0]))
			}
			out.Options.NoCreate = !create
		}
		if v, ok := q[ParamListen]; ok {
			if v[0] == "off" {
				out.Options.NoListen = true
			} else {
				problems = append(problems, parseListen(v[0], &out.Options)...)
				passwords = append(passwords, urlPasswords(v[0])...)
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
	if len(problems) == 0 {
		pc, err := pgxpool.ParseConfig(conn)
		if err != nil {
			problems = append(problems, "postgres: the connection string: "+redactConfigError(err, conn))
		}
		out.Pool = pc
	}
	if len(problems) > 0 {
		for i := range problems {
			for _, pw := range passwords {
				problems[i] = redact(problems[i], pw)
			}
		}
		return URLConfig{}, &baton.ConfigError{Problems: problems}
	}
	return out, nil
}

// parseListen reads ParamListen's connection string into o.Listen, or
// returns its problems.
func parseListen(v string, o *Options) []string {
	if strings.HasPrefix(v, "postgres://") || strings.HasPrefix(v, "postgresql://") {
		if _, ok := userinfoPassword(v); !ok {
			return []string{"postgres: " + ParamListen + ": the password has a malformed % escape: write %25 for a % and %40 for an @ in it"}
		}
		_, query, _ := strings.Cut(v, "?")
		if q, err := url.ParseQuery(query); err == nil {
			for k := range q {
				if strings.HasPrefix(k, "baton") {
					return []string{fmt.Sprintf("postgres: %s: parameter %s belongs on the main URL, not on %s", ParamListen, k, ParamListen)}
				}
			}
		}
	}
	lc, err := pgx.ParseConfig(v)
	if err != nil {
		return []string{"postgres: " + ParamListen + ": not a connection string pgx can use (a direct postgres:// URL to the server, %-escaped in the query, or off): " + redactConfigError(err, v)}
	}
	o.Listen = lc
	return nil
}

// userinfoPassword returns the password of a postgres:// URL's user
// information as pgx reads it (the user information ends at the first @
// before any /), and false when its % escapes are malformed.
func userinfoPassword(raw string) (string, bool) {
	_, rest, _ := strings.Cut(raw, "://")
	i := strings.IndexAny(rest, "@/")
	if i < 0 || rest[i] != '@' {
		return "", true
	}
	_, pw, ok := strings.Cut(rest[:i], ":")
	if !ok {
		return "", true
	}
	p, err := url.PathUnescape(pw)
	if err != nil {
		return pw, false
	}
	return p, true
}

// urlPasswords returns every form in which raw may hold a password (the
// user information's, escaped and not, and password= values), so that
// errors can be cleaned of them whatever quoted what.
func urlPasswords(raw string) []string {
	var pws []string
	add := func(p string) {
		if p != "" {
			pws = append(pws, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		pw, _ := userinfoPassword(raw)
		add(pw)
		_, rest, _ := strings.Cut(raw, "://")
		if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
			_, rawPW, _ := strings.Cut(rest[:i], ":")
			add(rawPW)
		}
		_, query, _ := strings.Cut(raw, "?")
		if q, err := url.ParseQuery(query); err == nil {
			for _, p := range q["password"] {
				add(p)
			}
		}
	}
	// Longest first, so that a password holding another one is replaced
	// whole.
	slices.SortFunc(pws, func(a, b string) int { return len(b) - len(a) })
	return pws
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
