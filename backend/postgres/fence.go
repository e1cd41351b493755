package postgres

import (
	"context"
	"fmt"
	"math"

	"github.com/batonhq/baton"
	"github.com/jackc/pgx/v5"
)

// Fence calls schema.fence(lease, token) (FenceSQL) in tx, the
// transaction of a job that writes on behalf of the term with token: from
// then on tx can commit only while that term is the lease's current one, and
// the next term cannot begin until tx ended (see the package doc). Call it
// before the writes it guards, in every transaction that must not outlive
// the term. Its error wraps ErrFenced (a *FencedError) when the term is
// not current; tx is then aborted and must be rolled back.
//
// Fence also lowers, for the rest of tx, statement_timeout and
// idle_in_transaction_session_timeout to the lease's TTL, so that a paused
// or runaway transaction holds the next holder up by at most about a TTL.
func Fence(ctx context.Context, tx pgx.Tx, schema, lease string, token uint64) error {
	if err := checkSchema(orDefault(schema)); err != nil {
		return fmt.Errorf("postgres: fence: %w", err)
	}
	if token > math.MaxInt64 {
		return &FencedError{Lease: lease, Token: token, Err: fmt.Errorf("token above the bigint range")}
	}
	_, err := tx.Exec(ctx, FenceSQL(schema), pgx.QueryExecModeExec, lease, int64(token))
	if err != nil {
		if IsFenced(err) {
			return &FencedError{Lease: lease, Token: token, Err: err}
		}
		return fmt.Errorf("postgres: fence lease %q token %d: %w", lease, token, err)
	}
	return nil
}

// FenceTerm is implemented by the Terms of a Backend: Fence(ctx, tx) is
// Fence with the Backend's schema and the term's lease and token.
type FenceTerm interface {
	baton.Term
	Fence(ctx context.Context, tx pgx.Tx) error
}

var _ FenceTerm = (*term)(nil)

// Beginner starts transactions: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Fenced runs fn in a transaction of db fenced on term t (a term of lease
// on a Backend with schema schema; see Fence), and commits it if fn
// returns nil. The commit succeeds only if t was the lease's current term
// until then. Its error wraps ErrFenced when the fence refused.
func Fenced(ctx context.Context, db Beginner, schema string, t baton.Term, fn func(pgx.Tx) error) (err error) {
	lease := ""
	if lt, ok := t.(interface{ Lease() string }); ok {
		lease = lt.Lease()
	}
	if lease == "" {
		return fmt.Errorf("postgres: Fenced: the term (%T) does not name its lease", t)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := Fence(ctx, tx, schema, lease, t.Token()); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if IsFenced(err) {
			return &FencedError{Lease: lease, Token: t.Token(), Err: err}
		}
		return err
	}
	return nil
}

func orDefault(schema string) string {
	if schema == "" {
		return DefaultSchema
	}
	return schema
}
