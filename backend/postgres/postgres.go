package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Backend runs baton leases in a PostgreSQL database. One Backend stands for
// one process: it holds one session row, renewed by one statement per
// RenewInterval, however many leases it holds, and one LISTEN connection.
// It is safe for concurrent use; it allows one campaign per lease name at a
// time, whatever the candidate.
type Backend struct {
	pool     *pgxpool.Pool
	o        options
	q        queries
	sessions *backend.SessionManager[string]
	epochs   backend.EpochTracker
	listen   *listener
	// id names this Backend in the leases' queues (the waiters table)
	// and its notification channel (WakeChannel).
	id     string
	reader *backend.BatchReader[leaseRow]
	ops    chan struct{} // admits statements other than renewals; see exec
}

var (
	_ baton.Backend           = (*Backend)(nil)
	_ baton.StateTerm         = (*term)(nil)
	_ baton.ResignRequestTerm = (*term)(nil)
)

// New returns a Backend on pool, which the caller owns and closes after
// Close. It checks that baton's schema (Options.Schema) exists, creating it
// when it is missing and the role may (unless Options.NoCreate); otherwise
// it returns a *SchemaError, which matches *baton.ConfigError. Bad options
// give a *baton.ConfigError naming every problem. ctx bounds the check.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Backend, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, &baton.ConfigError{Problems: []string{"postgres: the pool is nil: pass a *pgxpool.Pool from pgxpool.New"}}
	}
	b := &Backend{pool: pool, o: o, q: newQueries(o.schema), id: randomID(), ops: make(chan struct{}, max(1, pool.Config().MaxConns-1))}
	if err := b.ensureSchema(ctx); err != nil {
		return nil, err
	}
	b.sessions = backend.NewSessionManager(driver{b}, backend.SessionOptions[string]{
		Backend: "postgres",
		Config:  o.cfg,
		// A grant that waits longer than a TTL for a connection is of no
		// use to a campaign: report the database unavailable instead.
		GrantTimeout: o.cfg.TTL,
		// By then every contender has seen it unrenewed for a TTL.
		AbandonFor: o.cfg.TTL,
		Describe:   func(id string) string { return "postgres session " + id },
		Lost:       "was taken over by a contender that saw it unrenewed for a TTL, or deleted from " + o.schema + ".sessions",
		Log:        o.log,
	})
	b.listen = newListener(b)
	b.reader = newBatchReader(b)
	b.sessions.Go(func() { b.reader.Run(b.sessions.Context()) })
	if !o.NoListen {
		b.sessions.Go(func() { b.listen.run(b.sessions.Context()) })
	} else {
		b.listen.off("Options.NoListen is set")
	}
	return b, nil
}

// Config returns the timing the Backend uses, defaults filled in.
func (b *Backend) Config() backend.Config { return b.o.cfg }

// Schema returns the schema of baton's tables and fence function.
func (b *Backend) Schema() string { return b.o.schema }

// Close ends every term of this Backend (Err wraps baton.ErrClosed),
// deletes its session row and frees its leases in one statement (which
// notifies the waiters), and waits for its goroutines, within ctx. The pool
// is the caller's and stays open.
func (b *Backend) Close(ctx context.Context) error {
	return b.sessions.Close(ctx, nil)
}

// ensureSchema checks that the schema's objects exist, and creates them
// when they do not and it may.
func (b *Backend) ensureSchema(ctx context.Context) error {
	var ok bool
	err := b.scan(ctx, b.q.exists, nil, &ok)
	if err != nil {
		return fmt.Errorf("%w: postgres: check schema %q: %w", baton.ErrBackendUnavailable, b.o.schema, b.safeErr(err))
	}
	if ok {
		return nil
	}
	if b.o.NoCreate {
		return &SchemaError{Schema: b.o.schema, Reason: "its tables, their columns or the fence function are missing and Options.NoCreate is set", DDL: SchemaSQL(b.o.schema)}
	}
	// One creator at a time: CREATE ... IF NOT EXISTS races with itself.
	// One simple-protocol Exec is one implicit transaction, so the
	// transaction-level advisory lock works through PgBouncer too.
	_, err = b.pool.Exec(ctx, "SELECT pg_advisory_xact_lock(7340149233470118401);\n"+SchemaSQL(b.o.schema), pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		if s := sqlState(err); s == "42501" || s == "25006" { // insufficient_privilege, read_only_sql_transaction
			return &SchemaError{Schema: b.o.schema, Reason: "its tables, their columns or the fence function are missing, and this role may not create them (" + b.safeErr(err).Error() + ")", DDL: SchemaSQL(b.o.schema)}
		}
		return fmt.Errorf("%w: postgres: create schema %q: %w", baton.ErrBackendUnavailable, b.o.schema, b.safeErr(err))
	}
	b.o.log.Info("created baton's schema", "schema", b.o.schema)
	return nil
}

// safeErr returns err with the pool's password removed from its message,
// should the server or a driver ever echo it.
func (b *Backend) safeErr(err error) error {
	pw := b.pool.Config().ConnConfig.Password
	if pw == "" || err == nil {
		return err
	}
	if msg := err.Error(); redact(msg, pw) != msg {
		return errors.New(redact(msg, pw))
	}
	return err
}

// exec and scan run a statement of the Backend's in pgx's exec mode: one
// round trip on an unnamed statement, which works through PgBouncer in
// transaction-pooling mode whatever the pool's default_query_exec_mode (a
// named, cached statement does not: the next transaction may run on
// another server connection). Each takes one of the pool's connections
// but one (ops), so that the session's renewal (renewExec) always finds a
// connection, however many campaigns run: a renewal queued behind a
// thousand campaigns would let every term expire.
func (b *Backend) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := b.op(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer b.done()
	return b.pool.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

func (b *Backend) scan(ctx context.Context, sql string, args []any, dest ...any) error {
	if err := b.op(ctx); err != nil {
		return err
	}
	defer b.done()
	return b.pool.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(dest...)
}

// renewExec runs the session's renewal, outside ops.
func (b *Backend) renewExec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return b.pool.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

func (b *Backend) op(ctx context.Context) error {
	select {
	case b.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Backend) done() { <-b.ops }

// stmtCtx bounds one statement of a campaign or a release: never longer
// than the TTL, so that a hung query or connection cannot hold a campaign
// past the point where its session is useless.
func (b *Backend) stmtCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.o.cfg.TTL)
}

// MaxNameLen is the longest lease name, in bytes, that Campaign takes: the
// name is a NOTIFY payload (under 8,000 bytes) and the leases table's
// primary key (a B-tree entry must fit a third of a page).
const MaxNameLen = 1000

// Campaign implements baton.Backend.
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if name == "" || c.ID == "" {
		return nil, fmt.Errorf("postgres: lease name and candidate ID must not be empty (name %q, id %q)", name, c.ID)
	}
	if len(name) > MaxNameLen {
		return nil, fmt.Errorf("postgres: lease name of %d bytes is longer than %d (postgres.MaxNameLen): it is a NOTIFY payload and a primary key", len(name), MaxNameLen)
	}
	return b.sessions.Campaign(ctx, name, c.ID, func(sl *backend.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

// sameSession reports whether two lease rows name the same session (or
// none).
func sameSession(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// seen is a holder's session as a waiter last read it, and when (its own
// monotonic clock) it first read that renewal count.
type seen struct {
	session  string
	renewals int64
	at       time.Time
}

func (b *Backend) campaign(ctx context.Context, sl *backend.Slot, name, id string) (baton.Term, error) {
	wake, unsubscribe := b.listen.w.Subscribe(name, true)
	defer unsubscribe()
	joined := "" // the session under which this process joined the lease's queue
	defer func() {
		if joined != "" {
			b.leave(name)
		}
	}()
	var (
		last    seen
		batched *backend.BatchResult[leaseRow] // the row as a batch read it, to go by instead of reading it
	)
	for {
		s, err := b.sessions.Session(ctx)
		if err != nil {
			return nil, err
		}
		var r leaseRow
		now := time.Now()
		if batched != nil {
			r, now = batched.Value, batched.At
			batched = nil
		} else {
			if r, err = b.read(ctx, name); err != nil {
				return nil, b.sessions.CampaignErr(ctx, s, name, "read lease", err)
			}
			now = time.Now()
		}
		var (
			take bool
			dead string
			left time.Duration
		)
		// A session row that is gone reads as renewal count -1: it went
		// with its process's Close, which freed its leases too, so a lease
		// still naming it was left by an operator's DELETE or a restore
		// from a backup, and its holder may not know yet. It is timed like
		// a live one.
		count := int64(-1)
		if r.renewals != nil {
			count = *r.renewals
		}
		switch {
		case r.exists && r.holder == nil && r.reservedMS > 0:
			// Free, but kept for another process's queue head, which a
			// release woke: wait for it to take the lease, or for the
			// reservation to end.
			left = time.Duration(r.reservedMS) * time.Millisecond
		case !r.exists, r.holder == nil, r.session == nil, *r.session == s.ID:
			// Free, or left by our own session: nobody acts on it.
			take = true
		case last.session != *r.session || last.renewals != count:
			last = seen{session: *r.session, renewals: count, at: now}
			left = r.ttl(b.o.cfg.TTL)
		default:
			left = r.ttl(b.o.cfg.TTL) - now.Sub(last.at)
			if left <= 0 {
				b.o.log.Info("taking over a lease whose holder's session went unrenewed for a full TTL",
					"lease", name, "from", *r.holder, "session", *r.session, "ttl", r.ttl(b.o.cfg.TTL))
				take = true
				if count >= 0 {
					dead = *r.session
				}
			}
		}
		if take {
			t, err := b.acquire(ctx, s, sl, name, id, r, dead, last.renewals)
			if t != nil || err != nil {
				if t != nil {
					joined = "" // the acquisition took the process out of the queue
				}
				return t, err
			}
			joined = "" // the acquisition's statement left the queue, whatever it took
			// Another contender won the race, or our own session row is
			// gone (taken over while this process was paused) and the
			// acquisition, which requires it, did nothing. The latter
			// would loop here until the next renewal noticed.
			if err := b.checkSession(ctx, s); err != nil {
				return nil, b.sessions.CampaignErr(ctx, s, name, "check session", err)
			}
			last = seen{}
			continue
		}
		wait := left
		if !b.listen.listening() {
			wait = min(wait, b.o.poll)
		} else if joined != s.ID {
			// Queue for the lease, to be woken alone when it is released.
			// Only while notifications arrive: a process that polls would
			// swallow the wake-ups of those behind it.
			if b.o.beforeJoin != nil {
				b.o.beforeJoin(name)
			}
			var (
				tok  int64
				sess *string
			)
			sctx, cancel := b.stmtCtx(ctx)
			err := b.scan(sctx, b.q.join, []any{name, b.id, s.ID}, &tok, &sess)
			cancel()
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return nil, b.sessions.CampaignErr(ctx, s, name, "join the lease's queue", b.safeErr(err))
			}
			joined = s.ID
			if err != nil || uint64(tok) != r.token || !sameSession(sess, r.session) {
				// The lease changed between the read and the join (a
				// release there woke nobody): read it again now.
				continue
			}
		}
		// The row is read again when it comes due, in a batch with the
		// other waiters' rows; a notification has it read at once.
		req, cancel := b.reader.Request(name, now.Add(max(wait, time.Millisecond)))
		select {
		case <-ctx.Done():
			cancel()
			return nil, ctx.Err()
		case <-s.Context().Done():
			cancel()
		case <-wake:
			cancel()
			// Read at once, with every other waiter woken now (notifications
			// that came back wake them all): one statement for all of them.
			req, cancel := b.reader.Request(name, time.Now())
			select {
			case <-ctx.Done():
				cancel()
				return nil, ctx.Err()
			case <-s.Context().Done():
				cancel()
			case res := <-req.Result():
				if res.Err == nil {
					batched = &res
				}
			}
		case res := <-req.Result():
			if res.Err == nil {
				batched = &res
			}
			// A failed batch: the waiter reads the row itself, which
			// reports the error or mends a lost schema.
		}
	}
}

// acquire takes lease name for candidate id on session s, from the row r
// read before: free, or (dead not empty) from session dead, whose renewal
// count stayed renewals for a TTL. It returns (nil, nil) when the row
// changed meanwhile, so that the caller reads again.
func (b *Backend) acquire(ctx context.Context, s *backend.Session[string], sl *backend.Slot, name, id string, r leaseRow, dead string, renewals int64) (baton.Term, error) {
	token := r.token + 1
	if !r.exists || r.token>>32 == 0 {
		// A new row: the database may have lost an older one, whose
		// tokens this one must outrank.
		token = max(token, backend.EpochToken(b.epochs.Next(name, time.Now()), r.token&math.MaxUint32+1))
	}
	if token > math.MaxInt64 {
		return nil, fmt.Errorf("postgres: lease %q: token %d does not fit a bigint", name, token)
	}
	// The acquisition waits for the old term's open fenced transactions
	// (baton.fence's row lock): a statement in flight may run a TTL, and
	// the transaction then sit idle a TTL, before the server ends it.
	sctx, cancel := context.WithTimeout(ctx, 2*b.o.cfg.TTL+b.o.cfg.RenewInterval)
	defer cancel()
	var (
		tag pgconn.CommandTag
		err error
	)
	switch {
	case !r.exists:
		tag, err = b.exec(sctx, b.q.insert, name, id, s.ID, int64(token), b.ttlMS(), b.q.channel)
	case dead != "":
		tag, err = b.exec(sctx, b.q.takeOver, name, id, s.ID, int64(token), b.ttlMS(), int64(r.token), b.q.channel, dead, renewals)
	default:
		tag, err = b.exec(sctx, b.q.takeFree, name, id, s.ID, int64(token), b.ttlMS(), int64(r.token), b.q.channel, b.id)
	}
	if err != nil {
		// It may have landed: release whatever our session holds of name,
		// while our slot keeps the name claimed.
		b.sessions.CleanClaimed(sl, func() { b.dropLeftover(s, name) })
		return nil, b.sessions.CampaignErr(ctx, s, name, "acquire lease", b.safeErr(err))
	}
	if tag.RowsAffected() == 0 {
		return nil, nil
	}
	if prev, e := b.epochs.Saw(name, token>>32), token>>32; prev != 0 && e != prev {
		b.o.log.Warn("the lease's token epoch changed: the database lost the lease's row and it was created anew",
			"lease", name, "old_epoch", backend.FormatEpoch(prev), "new_epoch", backend.FormatEpoch(e), "token", token)
	}
	t := &term{b: b, s: s, name: name}
	bt, err := b.sessions.Start(s, sl, name, token, t.release, backend.StartOptions{Watch: func() {}})
	if err != nil {
		b.sessions.CleanClaimed(sl, func() { b.dropLeftover(s, name) })
		return nil, err
	}
	t.BasicTerm = bt
	b.o.log.Debug("acquired", "lease", name, "token", token, "session", s.ID)
	return t, nil
}

// leave takes this process out of the queue of lease name, passing on a
// wake-up it may have been sent, in the background: bounded by
// RenewInterval, and by Close. An entry a failed leave leaves behind is
// passed over once its session lapses, and a wake-up sent to it is passed
// on when it arrives (listener.session).
func (b *Backend) leave(name string) {
	b.sessions.Go(func() {
		ctx, cancel := context.WithTimeout(b.sessions.Context(), b.o.cfg.RenewInterval)
		defer cancel()
		if _, err := b.exec(ctx, b.q.leave, name, b.id); err != nil {
			b.o.log.Debug("could not leave a lease's queue", "lease", name, "err", b.safeErr(err))
		}
	})
}

// checkSession ends s (baton.ErrLeaseLost) if its row is gone.
func (b *Backend) checkSession(ctx context.Context, s *backend.Session[string]) error {
	sctx, cancel := b.stmtCtx(ctx)
	defer cancel()
	var n int
	if err := b.scan(sctx, b.q.sessionExists, []any{s.ID}, &n); err != nil {
		return b.safeErr(err)
	}
	if n == 0 {
		b.sessions.Lost(s)
	}
	return nil
}

// dropLeftover frees lease name if session s holds it, in the background
// after a failed acquisition or start.
func (b *Backend) dropLeftover(s *backend.Session[string], name string) {
	backend.Retry(b.sessions.Context(), b.o.cfg.RenewInterval/4, b.o.cfg.RenewInterval, true, func(ctx context.Context) error {
		_, err := b.exec(ctx, b.q.dropSession, name, s.ID, b.q.channel)
		if missingObject(err) {
			return nil
		}
		return err
	})
}

// leaseRow is a lease's row joined with its holder's session row.
type leaseRow struct {
	exists     bool
	holder     *string
	session    *string
	token      uint64
	ttlMS      int64
	renewals   *int64 // nil: no session row
	sessionTTL *int64
	since      *time.Time
	// reservedMS is how long the free lease stays kept for another
	// process's woken queue head (milliseconds); 0 when it is not.
	reservedMS int64
}

// ttl is how long a waiter must see r's session unrenewed: the longest of
// the lease's, the session's and its own TTL.
func (r leaseRow) ttl(own time.Duration) time.Duration {
	t := max(own, time.Duration(r.ttlMS)*time.Millisecond)
	if r.sessionTTL != nil {
		t = max(t, time.Duration(*r.sessionTTL)*time.Millisecond)
	}
	return t
}

func (b *Backend) read(ctx context.Context, name string) (leaseRow, error) {
	sctx, cancel := b.stmtCtx(ctx)
	defer cancel()
	var (
		r   leaseRow
		tok int64
	)
	err := b.scan(sctx, b.q.read, []any{name, b.id}, &r.holder, &r.session, &tok, &r.ttlMS, &r.renewals, &r.sessionTTL, &r.since, &r.reservedMS)
	if errors.Is(err, pgx.ErrNoRows) || missingObject(err) && !b.o.NoCreate {
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			// The database lost baton's schema (restored, wiped): make it
			// again; the lease reads as absent.
			if err := b.ensureSchema(sctx); err != nil {
				return leaseRow{}, err
			}
		}
		return leaseRow{}, nil
	}
	if err != nil {
		return leaseRow{}, b.safeErr(err)
	}
	r.exists, r.token = true, uint64(tok)
	if r.token>>32 != 0 {
		b.epochs.Report(b.o.log, backend.EpochLocation{Store: "PostgreSQL", Counter: "lease tokens", Lease: name, Kind: "row", Key: b.o.schema + ".leases"}, r.token>>32)
	}
	return r, nil
}

// Leader implements baton.Backend. It reports what the leases table says,
// which may name a holder that died, until a campaigning contender has seen
// its session unrenewed for a TTL; a lease whose holder's session row is
// gone has no leader.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	r, err := b.read(ctx, name)
	if err != nil {
		return baton.Record{}, backend.Unavailable(ctx, "postgres: read lease "+name, err)
	}
	return r.record(name)
}

// record is what Leader says of lease name whose row is r.
func (r leaseRow) record(name string) (baton.Record, error) {
	if !r.exists || r.holder == nil || r.renewals == nil {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	rec := baton.Record{Lease: name, Holder: *r.holder, Token: r.token}
	if r.since != nil {
		rec.Since = *r.since
	}
	return rec, nil
}

// term is a term of a lease on this Backend's session.
type term struct {
	*backend.BasicTerm
	b    *Backend
	s    *backend.Session[string]
	name string
}

// release frees the lease if this term still holds it, and notifies the
// waiters, in one statement.
func (t *term) release(ctx context.Context) error {
	sctx, cancel := t.b.stmtCtx(ctx)
	defer cancel()
	if _, err := t.b.exec(sctx, t.b.q.release, t.name, int64(t.Token()), t.s.ID, t.b.q.channel); err != nil && !missingObject(err) {
		return fmt.Errorf("postgres: release lease %q (it frees itself a TTL after the session's last renewal): %w", t.name, t.b.safeErr(err))
	}
	t.b.o.log.Debug("released", "lease", t.name, "token", t.Token())
	return nil
}

// LoadState implements baton.StateTerm.
func (t *term) LoadState(ctx context.Context) ([]byte, error) {
	sctx, cancel := t.b.stmtCtx(ctx)
	defer cancel()
	var v []byte
	err := t.b.scan(sctx, t.b.q.loadState, []any{t.name}, &v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, backend.Unavailable(ctx, "postgres: load state of lease "+t.name, t.b.safeErr(err))
	}
	return v, nil
}

// StoreState implements baton.StateTerm: one UPDATE that checks the lease
// row still names this term's token and session.
func (t *term) StoreState(ctx context.Context, value []byte) error {
	return backend.StoreState(ctx, t, value, func(ctx context.Context, value []byte) error {
		if value == nil {
			value = []byte{}
		}
		sctx, cancel := context.WithDeadline(ctx, t.SafeUntil())
		defer cancel()
		tag, err := t.b.exec(sctx, t.b.q.storeState, t.name, int64(t.Token()), t.s.ID, value)
		if err != nil {
			if e := t.Err(); e != nil {
				return backend.EndedError(t)
			}
			return backend.Unavailable(ctx, "postgres: store state of lease "+t.name, t.b.safeErr(err))
		}
		if tag.RowsAffected() == 0 {
			err := fmt.Errorf("%w: lease %q is no longer held by token %d", baton.ErrLeaseLost, t.name, t.Token())
			t.End(err)
			return err
		}
		return nil
	})
}

// Fence runs SELECT baton.fence(lease, token) in tx (see FenceSQL) for
// this term: tx commits only if this term is still the lease's current one
// when it commits. Its error wraps ErrFenced when the fence refused.
func (t *term) Fence(ctx context.Context, tx pgx.Tx) error {
	return Fence(ctx, tx, t.b.o.schema, t.name, t.Token())
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ttlMS is the TTL in whole milliseconds, rounded up: contenders wait at
// least that long, never less than the TTL.
func (b *Backend) ttlMS() int64 {
	return int64((b.o.cfg.TTL + time.Millisecond - 1) / time.Millisecond)
}
