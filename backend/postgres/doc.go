// Package postgres is a baton backend on PostgreSQL (pgx v5), with fencing
// inside the database: a job's own transaction calls baton.fence(lease,
// token), and a holder that was paused and resumes after a new holder
// started cannot commit.
//
// # Guarantees
//
//   - One holder per lease at a time, under the clock assumption below.
//     A contender takes a held lease over only after it has itself seen the
//     holder's session row unrenewed for a full TTL (the longer of the
//     holder's and its own) on its own monotonic clock; a lease whose
//     session row vanished (an operator's DELETE, a restore) is timed the
//     same way. A lease its holder released, or whose process closed its
//     Backend, is free at once. No two hosts' wall clocks are ever
//     compared; the database server's clock is read for humans only
//     (since, renewed_at).
//   - A term's SafeUntil is the send time of the last confirmed renewal of
//     the process's session + TTL − DriftMargin, on the holder's monotonic
//     clock; the term ends by itself there, even when the database cannot
//     be reached. A renewal runs under a context that ends at safe-until, and
//     every other statement under one that ends within a TTL, so a hung query
//     or connection never stretches a term.
//     Safe while the holder's and the contenders' clock rates differ by less
//     than DriftMargin over a TTL.
//   - Fencing tokens strictly increase across the terms of a lease: every
//     acquisition bumps the lease row's token in the same statement that
//     takes it; a release keeps it. A lease row created afresh starts at
//     epoch<<32 + 1, the epoch being the creator's wall-clock second (or
//     one above the highest it saw), so tokens keep rising after the table,
//     or the whole cluster, lost its data, provided the creator's clock
//     reads a later second than the lost row's epoch (package backend,
//     "Epoch tokens"). Tokens are kept as bigint: epochs up to 2^31 − 1
//     (the year 2093).
//   - baton.fence(lease, token) (see Fence and FenceSQL) makes the
//     transaction that calls it fail, with SQLSTATE BATON, unless token is
//     the lease's current term; once it passed, it holds a share lock on the
//     lease row until that transaction ends, which the next holder's
//     acquisition must wait for. So every fenced transaction of a term
//     commits before the next term begins, and none after: a holder paused
//     after fence() (SIGSTOP, a GC pause, a cut network) cannot commit once
//     its successor has started, while the current holder's fenced
//     transactions always may. The wait is bounded: fence() sets, for the
//     rest of its transaction, statement_timeout and
//     idle_in_transaction_session_timeout to the lease's TTL (or lower, if
//     they were lower), so the server ends a paused fenced transaction at
//     most a TTL after it went quiet (two, if a statement was running). See
//     docs/backends/postgres.md.
//   - Renewals cost one statement per process per RenewInterval, however
//     many leases the process holds: its leases point at one session row,
//     and a renewal bumps that row's counter.
//   - A release (Resign, Close) and a hand-over NOTIFY the lease's channel;
//     each process LISTENs on one connection, so waiters wake at once.
//     Where LISTEN cannot work (PgBouncer in transaction-pooling mode, which
//     this package detects by a probe), waiters poll every PollInterval, and
//     the Backend logs that once (Notifications reports it); the probe is
//     tried again later (after a minute, doubling up to 16 minutes). A
//     LISTEN connection silent for a TTL is pinged, and replaced when the
//     ping goes unanswered (a half-open connection).
//
// Not guaranteed: Leader may name a holder that died, until a campaigning
// contender has seen its session unrenewed for a TTL and taken the lease
// over (there is nobody to judge a dead holder otherwise); a fence protects
// only the writes made in the fenced transaction, in the same database.
// Passwords never appear in this package's errors or logs: errors name
// the host, port, database and user at most.
//
// # Use
//
// The caller owns the *pgxpool.Pool and closes it after the Backend
// (ParseURL reads a connection string with baton's own parameters):
//
//	pool, err := pgxpool.New(ctx, "postgres://baton@db.internal/app")
//	b, err := postgres.New(ctx, pool, postgres.Options{})
//	defer b.Close(ctx)
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report", Candidate: baton.Candidate{ID: host}})
//	err = e.Run(ctx, func(ctx context.Context, t baton.Term) error {
//		return postgres.Fenced(ctx, pool, "", t, func(tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, "INSERT INTO report_runs (token) VALUES ($1)", int64(t.Token()))
//			return err
//		})
//	})
//
// New creates the schema (SchemaSQL) when it is missing and the role may;
// otherwise it fails with a *SchemaError (which matches *baton.ConfigError)
// naming the DDL and GRANTs (SchemaSQL, GrantSQL) a DBA must apply. The
// Backend's Terms are FenceTerms: t.(postgres.FenceTerm).Fence(ctx, tx) is
// Fence with their own schema, lease and token.
package postgres
