package dynamodb

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton"
)

var _ baton.LeaderWatcher = (*Backend)(nil)

// WatchLeader implements baton.LeaderWatcher by polling: it reads the lease
// (as Leader does) every PollInterval, two strongly consistent reads a
// poll, and calls fn after each read. Like Leader, it names a dead holder
// until a contender took the lease over.
func (b *Backend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	if name == "" {
		return fmt.Errorf("dynamodb: lease name must not be empty")
	}
	closed := b.sessions.Context() // cancelled by Close
	if closed.Err() != nil {
		return fmt.Errorf("%w: dynamodb: WatchLeader on a closed Backend", baton.ErrClosed)
	}
	for {
		rec, err := b.Leader(ctx, name)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case closed.Err() != nil:
			return fmt.Errorf("%w: dynamodb: the Backend was closed", baton.ErrClosed)
		}
		fn(rec, err)
		timer := time.NewTimer(b.o.poll)
		select {
		case <-ctx.Done():
		case <-closed.Done():
		case <-timer.C:
		}
		timer.Stop()
	}
}
