package zookeeper

import (
	"context"
	"errors"
	"time"

	"github.com/batonhq/baton"
)

var _ baton.LeaderWatcher = (*Backend)(nil)

// WatchLeader implements baton.LeaderWatcher. It reads who leads as Leader
// does, leaving a child watch on the latch path (or, while the path does
// not exist, a watch on its creation), and reads again when the watch
// fires: a listing and a read or two per change, and nothing while nothing
// changes. The client sets its watches again when it reconnects.
func (b *Backend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	if err := CheckName(name); err != nil {
		return err
	}
	const retryMin = 100 * time.Millisecond
	retry := retryMin
	for {
		rec, ch, err := b.leader(ctx, name, true)
		switch {
		case b.isClosed():
			return baton.ErrClosed
		case ctx.Err() != nil:
			return ctx.Err()
		}
		fn(rec, err)
		if ch == nil {
			// Unanswered, or answered without a watch left behind.
			if errors.Is(err, baton.ErrNoLeader) {
				retry = retryMin
			}
			select {
			case <-ctx.Done():
			case <-b.ctx.Done():
			case <-time.After(retry):
			}
			retry = min(2*retry, b.cfg.TTL)
			continue
		}
		retry = retryMin
		select {
		case <-ctx.Done():
		case <-b.ctx.Done():
		case <-ch:
		}
	}
}
