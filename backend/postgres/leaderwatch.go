package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton"
)

var _ baton.LeaderWatcher = (*Backend)(nil)

// WatchLeader implements baton.LeaderWatcher. It reads the lease once, then
// again each time a NOTIFY names it (a release, a hand-over, a takeover)
// and whenever the LISTEN connection was re-established, so that it sends
// nothing while nothing changes. Without notifications (PgBouncer in
// transaction-pooling mode, Options.NoListen) it reads every
// PollInterval. Like Leader, it names a dead holder until a contender took
// the lease over.
func (b *Backend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	if name == "" {
		return fmt.Errorf("postgres: lease name must not be empty")
	}
	closed := b.sessions.Context() // cancelled by Close
	if closed.Err() != nil {
		return fmt.Errorf("%w: postgres: WatchLeader on a closed Backend", baton.ErrClosed)
	}
	wake, unsubscribe := b.listen.w.Subscribe(name, false)
	defer unsubscribe()
	for {
		rec, err := b.Leader(ctx, name)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case closed.Err() != nil:
			return fmt.Errorf("%w: postgres: the Backend was closed", baton.ErrClosed)
		}
		fn(rec, err)
		var (
			tick  <-chan time.Time
			timer *time.Timer
		)
		if err != nil || !b.listen.listening() {
			timer = time.NewTimer(b.o.poll)
			tick = timer.C
		}
		select {
		case <-ctx.Done():
		case <-closed.Done():
		case <-wake:
		case <-tick:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}
