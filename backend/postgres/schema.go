package postgres

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultSchema is the schema baton's tables and function live in when
// Options.Schema is empty.
const DefaultSchema = "baton"

// FencedSQLState is the SQLSTATE with which baton.fence refuses a term that
// is not the lease's current one.
const FencedSQLState = "BATON"

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkSchema reports a schema name that is not a plain lower-case SQL
// identifier (which needs no quoting).
func checkSchema(name string) error {
	if !identRE.MatchString(name) {
		return fmt.Errorf("schema name %q must be a plain SQL identifier: lower-case letters, digits and _, not starting with a digit, at most 63 characters", name)
	}
	return nil
}

// SchemaSQL returns the DDL of baton's schema named schema (DefaultSchema
// when empty): the sessions and leases tables and the fence function. It is
// idempotent (IF NOT EXISTS, CREATE OR REPLACE), so that it may go into a
// team's own migrations as it is; `baton postgres schema` prints it. It
// panics on a schema name that is not a plain identifier; New reports
// that as a *baton.ConfigError first.
func SchemaSQL(schema string) string {
	s := mustSchema(schema)
	return strings.ReplaceAll(schemaTemplate, "@", s)
}

// GrantSQL returns the least-privilege GRANTs for schema (DefaultSchema
// when empty): role runs baton (campaigns, renews, releases; it needs no
// DDL rights once the schema exists), and fencer, if not empty, is a role
// whose jobs call the fence function and nothing else of baton's.
//
// The baton role may read and write the two tables, never create or drop
// anything. The fencer may only execute baton.fence, which runs with its
// owner's rights (SECURITY DEFINER), so jobs need no privilege on baton's
// tables, and cannot move a lease.
func GrantSQL(schema, role, fencer string) string {
	s := mustSchema(schema)
	var b strings.Builder
	fmt.Fprintf(&b, "GRANT USAGE ON SCHEMA %s TO %s;\n", s, role)
	fmt.Fprintf(&b, "GRANT SELECT, INSERT, UPDATE, DELETE ON %s.sessions, %s.leases, %s.waiters TO %s;\n", s, s, s, role)
	fmt.Fprintf(&b, "GRANT EXECUTE ON FUNCTION %s.fence(text, bigint) TO %s;\n", s, role)
	if fencer != "" {
		fmt.Fprintf(&b, "GRANT USAGE ON SCHEMA %s TO %s;\n", s, fencer)
		fmt.Fprintf(&b, "GRANT EXECUTE ON FUNCTION %s.fence(text, bigint) TO %s;\n", s, fencer)
	}
	return b.String()
}

// FenceSQL returns the statement that fences a transaction on lease's term
// token in schema (DefaultSchema when empty), with $1 the lease and $2 the
// token: SELECT baton.fence($1, $2).
func FenceSQL(schema string) string {
	return "SELECT " + mustSchema(schema) + ".fence($1::text, $2::bigint)"
}

// wakePrefix starts every process channel (WakeChannel).
const wakePrefix = "baton_w_"

// WakeChannel returns the NOTIFY channel of the process whose Backend has
// listener ID id: a release notifies the first live process in the
// lease's queue (the waiters table) on it, the payload being the lease
// name. IDs are random, so one channel serves every schema.
func WakeChannel(id string) string { return wakePrefix + id }

// listenerAppName is the application_name of the LISTEN connection of the
// process whose listener ID is id. A release wakes only a queued process
// whose LISTEN connection the server still has (pg_stat_activity shows
// every role's application_name): a process that crashed closed it, and a
// notification on its channel would reach nobody.
func listenerAppName(id string) string { return listenerAppPrefix + id }

// listenerAppPrefix starts the application_name of a LISTEN connection.
const listenerAppPrefix = "baton listen "

// Channel returns the NOTIFY channel of schema (DefaultSchema when empty):
// its payload is the name of a lease that was released or handed over.
func Channel(schema string) string { return mustSchema(schema) + "_leases" }

func mustSchema(schema string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := checkSchema(schema); err != nil {
		panic("postgres: " + err.Error())
	}
	return schema
}

// schemaTemplate is the DDL with @ for the schema name.
//
// A session row stands for one process (one Backend): its renewals counter
// moves on each renewal, and contenders time a holder by watching it on
// their own monotonic clocks; renewed_at is the server's clock, for humans.
// A lease row names its holder's session; the token is never reset.
//
// fence is SECURITY DEFINER so that a job's role needs no privilege on
// the tables (a SELECT ... FOR SHARE needs UPDATE rights), with a fixed
// search_path so that the caller cannot substitute objects. Its lock and
// timeouts are explained in docs/backends/postgres.md.
const schemaTemplate = `CREATE SCHEMA IF NOT EXISTS @;

CREATE TABLE IF NOT EXISTS @.sessions (
    id         text        PRIMARY KEY,
    owner      text        NOT NULL,
    ttl_ms     bigint      NOT NULL CHECK (ttl_ms > 0),
    renewals   bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    renewed_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE @.sessions IS 'baton: one row per process; renewed every renew interval (renewals + 1); contenders time it on their own monotonic clocks';

CREATE TABLE IF NOT EXISTS @.leases (
    name     text        PRIMARY KEY,
    holder   text,
    session  text,
    token    bigint      NOT NULL CHECK (token > 0),
    ttl_ms   bigint      NOT NULL CHECK (ttl_ms > 0),
    since    timestamptz,
    state    bytea
);
COMMENT ON TABLE @.leases IS 'baton: one row per lease; holder/session NULL when free; token = epoch<<32 + counter, never reset';
CREATE INDEX IF NOT EXISTS leases_session_idx ON @.leases (session) WHERE session IS NOT NULL;
-- A release keeps the free lease for the queue head it woke, briefly.
ALTER TABLE @.leases ADD COLUMN IF NOT EXISTS reserved_for text, ADD COLUMN IF NOT EXISTS reserved_until timestamptz;

CREATE TABLE IF NOT EXISTS @.waiters (
    name     text        NOT NULL,
    listener text        NOT NULL,
    session  text        NOT NULL,
    joined   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (name, listener)
);
COMMENT ON TABLE @.waiters IS 'baton: the processes waiting for each lease, first joined first; a release notifies the first one whose session is live on its own channel';

CREATE OR REPLACE FUNCTION @.fence(lease text, token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fence$
DECLARE
    cur    bigint;
    who    text;
    ttl    bigint;
BEGIN
    -- FOR SHARE: the next holder's acquisition (an UPDATE of this row)
    -- waits until this transaction ends, so no fenced write of this term
    -- commits after the next term began.
    SELECT l.token, l.holder, l.ttl_ms INTO cur, who, ttl FROM @.leases l WHERE l.name = fence.lease FOR SHARE;
    IF cur IS NULL OR who IS NULL OR cur <> fence.token THEN
        RAISE EXCEPTION USING ERRCODE = 'BATON',
            MESSAGE = format('baton: fenced: token %s of lease %L is not its current term', fence.token, fence.lease),
            DETAIL = format('current token %s, holder %s', coalesce(cur::text, 'none'), coalesce(who, 'none'));
    END IF;
    -- Bound how long a paused or runaway transaction can hold the next
    -- holder up: at most a TTL per statement and per idle gap.
    IF (SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'statement_timeout') NOT BETWEEN 1 AND ttl THEN
        PERFORM pg_catalog.set_config('statement_timeout', ttl::text, true);
    END IF;
    IF (SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'idle_in_transaction_session_timeout') NOT BETWEEN 1 AND ttl THEN
        PERFORM pg_catalog.set_config('idle_in_transaction_session_timeout', ttl::text, true);
    END IF;
END
$fence$;
REVOKE ALL ON FUNCTION @.fence(text, bigint) FROM PUBLIC;
`
