package postgres

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/jackc/pgx/v5"
)

// Options configures a Backend. The zero value means the documented
// defaults.
type Options struct {
	// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s,
	// TTL/3, TTL/10). The process's session row is renewed every
	// RenewInterval, one UPDATE however many leases it holds.
	backend.Config

	// Schema is the schema of baton's tables and fence function. Empty
	// means DefaultSchema ("baton"). It must be a plain lower-case SQL
	// identifier.
	Schema string

	// NoCreate makes New fail with a *SchemaError when the schema is
	// missing, rather than create it. By default New creates it when the
	// role may, and fails with a *SchemaError (naming the DDL) when it may
	// not.
	NoCreate bool

	// PollInterval is how often a waiting candidate reads its lease when
	// notifications are off (LISTEN failed, as through PgBouncer in
	// transaction-pooling mode). Zero means RenewInterval. With
	// notifications, a waiter reads only when a NOTIFY names its lease
	// and when the holder's TTL is due.
	PollInterval time.Duration

	// Listen, if not nil, is the connection configuration used for LISTEN
	// instead of a connection from the pool: a direct URL to the server
	// when the pool goes through PgBouncer in transaction-pooling mode. The
	// Backend opens and closes that one connection itself.
	Listen *pgx.ConnConfig

	// NoListen turns notifications off: waiters poll every PollInterval.
	NoListen bool

	// Owner names this process in the sessions table, for humans. Empty
	// means "HOSTNAME/PID".
	Owner string

	// Logger receives log lines (group "postgres"). Nil means silent.
	Logger *slog.Logger

	// listenTiming, zero but in tests (export_test.go), replaces the
	// LISTEN connection's health timing.
	listenTiming listenTiming
	// beforeJoin, nil but in tests (export_test.go), runs before a waiter
	// joins a lease's queue.
	beforeJoin func(name string)
}

// listenTiming is how the LISTEN connection is kept healthy: a connection
// silent for ping is pinged, and replaced when the ping is not answered
// within pingTimeout; a probe that found notifications not delivered is
// tried again after retry, doubling up to retryMax.
type listenTiming struct {
	ping, pingTimeout, retry, retryMax time.Duration
}

// options are Options with the defaults filled in.
type options struct {
	Options
	cfg    backend.Config
	schema string
	poll   time.Duration
	log    *slog.Logger
}

// withDefaults fills in o's defaults, or returns a *baton.ConfigError naming
// every invalid field.
func (o Options) withDefaults() (options, error) {
	var problems []string
	cfg, err := o.Config.WithDefaults()
	if err != nil {
		if ce, ok := err.(*baton.ConfigError); ok {
			problems = append(problems, ce.Problems...)
		} else {
			problems = append(problems, err.Error())
		}
	}
	schema := o.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	if err := checkSchema(schema); err != nil {
		problems = append(problems, "Schema: "+err.Error())
	}
	if o.PollInterval < 0 {
		problems = append(problems, fmt.Sprintf("PollInterval (%s) must be positive, or zero for RenewInterval", o.PollInterval))
	}
	if len(problems) > 0 {
		return options{}, &baton.ConfigError{Problems: problems}
	}
	poll := o.PollInterval
	if poll == 0 {
		poll = cfg.RenewInterval
	}
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lt := o.listenTiming
	if lt.ping <= 0 {
		lt.ping = cfg.TTL
	}
	if lt.pingTimeout <= 0 {
		lt.pingTimeout = min(probeTimeout, cfg.TTL)
	}
	if lt.retry <= 0 {
		lt.retry = probeRetry
	}
	if lt.retryMax < lt.retry {
		lt.retryMax = max(probeRetryMax, lt.retry)
	}
	o.listenTiming = lt
	return options{Options: o, cfg: cfg, schema: schema, poll: poll, log: log.WithGroup("postgres")}, nil
}
