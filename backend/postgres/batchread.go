package postgres

import (
	"context"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/jackc/pgx/v5"
)

// newBatchReader returns the reader of the lease rows that this Backend's
// waiters need, with one statement for every row that comes due within a
// PollInterval (backend.BatchReader): a standby for 10,000 leases then runs
// about one statement per PollInterval rather than one per lease per TTL
// (a thousand a second at TTL 10 s). A row comes due when its waiter would
// have read it itself: when the holder's session, as last read, will have
// gone unrenewed for a TTL, or, while notifications do not flow, at its
// next poll.
func newBatchReader(b *Backend) *backend.BatchReader[leaseRow] {
	return backend.NewBatchReader(b.o.poll, b.readRows)
}

// readRows reads the rows of leases names in one statement: a name without
// a row is absent.
func (b *Backend) readRows(ctx context.Context, names []string) (map[string]leaseRow, error) {
	sctx, cancel := b.stmtCtx(ctx)
	defer cancel()
	if err := b.op(sctx); err != nil {
		return nil, err
	}
	defer b.done()
	rows, err := b.pool.Query(sctx, b.q.readMany, pgx.QueryExecModeExec, names, b.id)
	if err != nil {
		return nil, b.safeErr(err)
	}
	out := make(map[string]leaseRow, len(names))
	var (
		name string
		r    leaseRow
		tok  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &r.holder, &r.session, &tok, &r.ttlMS, &r.renewals, &r.sessionTTL, &r.since, &r.reservedMS}, func() error {
		r.exists, r.token = true, uint64(tok)
		if r.token>>32 != 0 {
			b.epochs.Report(b.o.log, backend.EpochLocation{Store: "PostgreSQL", Counter: "lease tokens", Lease: name, Kind: "row", Key: b.o.schema + ".leases"}, r.token>>32)
		}
		out[name] = r
		r = leaseRow{}
		return nil
	})
	if err != nil {
		return nil, b.safeErr(err)
	}
	return out, nil
}

var _ baton.LeadersReader = (*Backend)(nil)

// Leaders implements baton.LeadersReader: what Leader says of each name,
// from one statement for all of them.
func (b *Backend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	recs, errs := make([]baton.Record, len(names)), make([]error, len(names))
	if len(names) == 0 {
		return recs, errs
	}
	rows, err := b.readRows(ctx, names)
	if err != nil && missingObject(err) && !b.o.NoCreate {
		// The database lost baton's schema, as Leader finds it: make it
		// again; every lease reads as absent.
		sctx, cancel := b.stmtCtx(ctx)
		err = b.ensureSchema(sctx)
		cancel()
		rows = nil
	}
	if err != nil {
		err = backend.Unavailable(ctx, fmt.Sprintf("postgres: read %d leases", len(names)), err)
		for i := range errs {
			errs[i] = err
		}
		return recs, errs
	}
	for i, name := range names {
		recs[i], errs[i] = rows[name].record(name)
	}
	return recs, errs
}
