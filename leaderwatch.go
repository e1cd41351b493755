package baton

import (
	"context"
	"errors"
	"time"
)

// LeaderWatcher is implemented by a Backend that can say who holds a lease
// each time that changes, from a watch that costs the server nothing while
// nothing changes. Elector.WatchLeader uses it; for a Backend without it,
// Elector.WatchLeader asks Backend.Leader every LeaderPollInterval.
type LeaderWatcher interface {
	// WatchLeader calls fn with what Leader would return for lease name
	// (a Record, or an error: one wrapping ErrNoLeader when nobody holds
	// it), first as soon as it knows, then each time that may have
	// changed, until ctx ends or the Backend is closed. It then returns
	// ctx's error, or one wrapping ErrClosed; it returns at once with an
	// error for a name the Backend refuses. While the server cannot be
	// reached it calls fn with the error and keeps trying. fn is called
	// from one goroutine at a time, and may be called again with an
	// unchanged answer.
	WatchLeader(ctx context.Context, name string, fn func(Record, error)) error
}

// LeaderPollInterval is how often Elector.WatchLeader asks a Backend that
// is not a LeaderWatcher who leads, while its Elector does not lead.
const LeaderPollInterval = 5 * time.Second

// leaderPollTimeout bounds each of those questions.
const leaderPollTimeout = 2 * time.Second

// WatchLeader calls fn with who holds the Elector's lease, as
// LeaderWatcher.WatchLeader does, until ctx ends or the backend is closed,
// and returns ctx's error or one wrapping ErrClosed. A backend that
// implements LeaderWatcher pushes each change; any other is asked every
// LeaderPollInterval while this Elector does not lead (fn then gets an
// error wrapping context.DeadlineExceeded for a question unanswered within
// 2 s). It does not depend on Run and may be called at any time.
func (e *Elector) WatchLeader(ctx context.Context, fn func(Record, error)) error {
	if w, ok := e.b.(LeaderWatcher); ok {
		return w.WatchLeader(ctx, e.cfg.Lease, fn)
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		t.Reset(LeaderPollInterval)
		if _, ok := e.isLeader(); ok {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, leaderPollTimeout)
		rec, err := e.b.Leader(qctx, e.cfg.Lease)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrClosed):
			return err
		}
		fn(rec, err)
	}
}
