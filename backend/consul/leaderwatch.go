package consul

import (
	"context"
	"errors"
	"time"

	"github.com/batonhq/baton"
	"github.com/hashicorp/consul/api"
)

var _ baton.LeaderWatcher = (*Backend)(nil)

// WatchLeader implements baton.LeaderWatcher. It follows the lease's key
// through the blocking query the Backend keeps open anyway for the keys
// its campaigns wait for and its terms hold (see Costs in the package
// doc), and reads the lease's epoch (and, for a `consul lock` holder, its
// session) only when the key changed: nothing more while nothing changes.
func (b *Backend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	key, err := b.Key(name)
	if err != nil {
		return err
	}
	s := b.w.subscribe(key)
	if s == nil {
		return baton.ErrClosed
	}
	defer b.w.unsubscribe(s)
	var (
		after uint64
		last  *api.KVPair
		known bool
		retry time.Duration // after a read that failed: read again then
	)
	for {
		st, _, err := b.w.next(ctx, s, after, retry, nil)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return baton.ErrClosed
		}
		after = st.seq
		if st.err != nil {
			known = false
			fn(baton.Record{}, b.unavailable(ctx, "watch "+key, st.err))
			continue
		}
		if known && samePair(last, st.pair) {
			continue
		}
		rec, err := b.recordOf(ctx, name, key, st.pair)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last, known, retry = st.pair, true, 0
		if errors.Is(err, baton.ErrBackendUnavailable) {
			known, retry = false, time.Second
		}
		fn(rec, err)
	}
}
