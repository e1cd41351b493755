package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton"
)

var _ baton.LeaderWatcher = (*Backend)(nil)

// WatchLeader implements baton.LeaderWatcher. It reads the lease once,
// then again each time the release channel names it (an acquisition, a
// release), when its holder's key is due to expire, and every
// PollInterval (a redsync mutex publishes nothing). Like Leader, it names
// a dead holder until its key expired.
func (b *Backend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	if name == "" {
		return fmt.Errorf("redis: lease name must not be empty")
	}
	closed := b.sessions.Context() // cancelled by Close
	if closed.Err() != nil {
		return fmt.Errorf("%w: redis: WatchLeader on a closed Backend", baton.ErrClosed)
	}
	wake, unsubscribe := b.listen.w.Subscribe(name, false)
	defer unsubscribe()
	for {
		rec, left, err := b.read(ctx, name)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case closed.Err() != nil:
			return fmt.Errorf("%w: redis: the Backend was closed", baton.ErrClosed)
		}
		fn(rec, err)
		wait := b.o.poll
		if left > 0 {
			wait = min(wait, left+time.Millisecond)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-closed.Done():
		case <-wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}
