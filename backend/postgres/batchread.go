package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/jackc/pgx/v5"
)

// batchReader reads the lease rows that this Backend's waiters need, with
// one statement for every row that comes due within a PollInterval: a
// standby for 10,000 leases then runs about one statement per PollInterval
// rather than one per lease per TTL (a thousand a second at TTL 10 s). A
// row comes due when its waiter would have read it itself: when the
// holder's session, as last read, will have gone unrenewed for a TTL, or,
// while notifications do not flow, at its next poll. Reading a row early
// is always allowed: the waiter only sees a fresher row, and times the
// holder from when it read it.
type batchReader struct {
	b *Backend

	mu      sync.Mutex
	waiting map[*readReq]struct{}
	kick    chan struct{} // a request came due sooner than the reader sleeps
	batches int           // statements run
}

// readReq is one waiter's request for its row at due or later.
type readReq struct {
	name string
	due  time.Time
	got  chan readResult // buffered; receives once
}

// readResult is a row as a batch read it, and when the read returned: the
// waiter's clock for the holder's session starts there, no earlier than
// the row was read.
type readResult struct {
	r   leaseRow
	at  time.Time
	err error
}

func newBatchReader(b *Backend) *batchReader {
	return &batchReader{b: b, waiting: map[*readReq]struct{}{}, kick: make(chan struct{}, 1)}
}

// request asks for name's row at due or later; cancel withdraws a request
// whose result is no longer wanted.
func (br *batchReader) request(name string, due time.Time) (req *readReq, cancel func()) {
	req = &readReq{name: name, due: due, got: make(chan readResult, 1)}
	br.mu.Lock()
	br.waiting[req] = struct{}{}
	br.mu.Unlock()
	select {
	case br.kick <- struct{}{}:
	default:
	}
	return req, func() {
		br.mu.Lock()
		delete(br.waiting, req)
		br.mu.Unlock()
	}
}

// run reads the rows as they come due until ctx ends.
func (br *batchReader) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		br.mu.Lock()
		var first time.Time
		for req := range br.waiting {
			if first.IsZero() || req.due.Before(first) {
				first = req.due
			}
		}
		br.mu.Unlock()
		if first.IsZero() {
			timer.Stop()
		} else {
			timer.Reset(max(time.Until(first), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-br.kick:
			continue
		case <-timer.C:
		}
		// Everything due within the next PollInterval goes in this batch:
		// the next one would come no sooner.
		horizon := time.Now().Add(br.b.o.poll)
		var batch []*readReq
		br.mu.Lock()
		for req := range br.waiting {
			if !req.due.After(horizon) {
				batch = append(batch, req)
				delete(br.waiting, req)
			}
		}
		br.mu.Unlock()
		br.read(ctx, batch)
	}
}

// read reads the rows of batch in one statement and hands each its row.
func (br *batchReader) read(ctx context.Context, batch []*readReq) {
	if len(batch) == 0 {
		return
	}
	names := make([]string, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	for _, req := range batch {
		if !seen[req.name] {
			seen[req.name] = true
			names = append(names, req.name)
		}
	}
	rows, err := br.readRows(ctx, names)
	at := time.Now()
	br.mu.Lock()
	br.batches++
	br.mu.Unlock()
	for _, req := range batch {
		req.got <- readResult{r: rows[req.name], at: at, err: err}
	}
}

func (br *batchReader) readRows(ctx context.Context, names []string) (map[string]leaseRow, error) {
	b := br.b
	sctx, cancel := b.stmtCtx(ctx)
	defer cancel()
	if err := b.op(sctx); err != nil {
		return nil, err
	}
	defer b.done()
	rows, err := b.pool.Query(sctx, b.q.readMany, pgx.QueryExecModeExec, names)
	if err != nil {
		return nil, b.safeErr(err)
	}
	out := make(map[string]leaseRow, len(names))
	var (
		name string
		r    leaseRow
		tok  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &r.holder, &r.session, &tok, &r.ttlMS, &r.renewals, &r.sessionTTL, &r.since}, func() error {
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
