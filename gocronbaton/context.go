package gocronbaton

import (
	"context"
	"sync"
	"time"

	"github.com/batonhq/baton"
)

type termKey struct{}

// TermFromContext returns the term carried by the context of a job wrapped
// with Elector.Job or Locker.Job, so that code deep in the job can send its
// fencing token downstream.
func TermFromContext(ctx context.Context) (baton.Term, bool) {
	t, ok := ctx.Value(termKey{}).(baton.Term)
	return t, ok
}

// termContext returns a context carrying t that ends when parent ends, when
// t ends, or when t's safe-until deadline passes — the last for terms of
// third-party backends that do not end themselves at it. stop releases it
// and waits for its goroutine.
func termContext(parent context.Context, t baton.Term) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, termKey{}, t))
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		timer := time.NewTimer(time.Until(t.SafeUntil()))
		defer timer.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.Done():
				cancel(t.Err())
				return
			case <-timer.C:
				if left := time.Until(t.SafeUntil()); left > 0 {
					timer.Reset(left) // renewed meanwhile
					continue
				}
				cancel(baton.ErrExpired)
				return
			}
		}
	})
	return ctx, func() {
		close(quit)
		wg.Wait()
		cancel(nil)
	}
}
