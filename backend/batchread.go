package backend

import (
	"context"
	"sync"
	"time"
)

// BatchReader gathers the reads of a process's waiters into batches. A
// waiter asks for its lease's record at a due time (when it would have
// read it itself: its next poll, or when the holder would have expired);
// the reader sleeps until the first request comes due, then reads every
// record due within the horizon in one call of read: a standby for 10,000
// leases then sends about one request per horizon instead of one per lease.
// Reading a record early is always allowed: its waiter only sees a fresher
// record, and times the holder from when the batch returned.
type BatchReader[R any] struct {
	horizon time.Duration
	read    func(ctx context.Context, names []string) (map[string]R, error)

	mu      sync.Mutex
	waiting map[*BatchRequest[R]]struct{}
	kick    chan struct{} // a request came due sooner than the reader sleeps
	off     bool
}

// BatchRequest is one waiter's request for a record at its due time or
// later.
type BatchRequest[R any] struct {
	name string
	due  time.Time
	got  chan BatchResult[R] // buffered; receives once
}

// Result receives the batch's result once.
func (r *BatchRequest[R]) Result() <-chan BatchResult[R] { return r.got }

// BatchResult is a record as a batch read it: the zero R when the store
// had none. Sent is when the batch was sent, At when it returned (a
// waiter's clock for the holder starts there, no earlier than the record
// was read).
type BatchResult[R any] struct {
	Value    R
	Sent, At time.Time
	Err      error
}

// NewBatchReader returns a reader that batches requests due within horizon
// and reads them with read, which returns the records by name (a name
// without a record is absent). Run runs it.
func NewBatchReader[R any](horizon time.Duration, read func(ctx context.Context, names []string) (map[string]R, error)) *BatchReader[R] {
	return &BatchReader[R]{horizon: horizon, read: read, waiting: map[*BatchRequest[R]]struct{}{}, kick: make(chan struct{}, 1)}
}

// Request asks for name's record at due or later; cancel withdraws a
// request whose result is no longer wanted. It returns a nil request once
// Off was called: the waiter then reads by itself.
func (br *BatchReader[R]) Request(name string, due time.Time) (req *BatchRequest[R], cancel func()) {
	br.mu.Lock()
	if br.off {
		br.mu.Unlock()
		return nil, func() {}
	}
	req = &BatchRequest[R]{name: name, due: due, got: make(chan BatchResult[R], 1)}
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

// Off makes later requests return nil (the store refused batches, say).
// Requests already made are still answered.
func (br *BatchReader[R]) Off() {
	br.mu.Lock()
	br.off = true
	br.mu.Unlock()
}

// Run reads the records as they come due until ctx ends.
func (br *BatchReader[R]) Run(ctx context.Context) {
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
		// Everything due within the horizon goes in this batch: the next
		// one would come no sooner.
		horizon := time.Now().Add(br.horizon)
		var batch []*BatchRequest[R]
		br.mu.Lock()
		for req := range br.waiting {
			if !req.due.After(horizon) {
				batch = append(batch, req)
				delete(br.waiting, req)
			}
		}
		br.mu.Unlock()
		br.readBatch(ctx, batch)
	}
}

// readBatch reads the records of batch in one call and hands each its own.
func (br *BatchReader[R]) readBatch(ctx context.Context, batch []*BatchRequest[R]) {
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
	sent := time.Now()
	records, err := br.read(ctx, names)
	at := time.Now()
	for _, req := range batch {
		req.got <- BatchResult[R]{Value: records[req.name], Sent: sent, At: at, Err: err}
	}
}
