package etcd

import (
	"context"
	"errors"
	"time"

	"github.com/batonhq/baton"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ baton.LeaderWatcher = (*Backend)(nil)

// WatchLeader implements baton.LeaderWatcher. It reads who leads as Leader
// does, then watches the election's keys (Prefix + name + "/") from the
// revision it read at, and reads again when one of them is put or deleted:
// one read per change, and nothing while nothing changes (the watch's
// events flow from the server).
func (b *Backend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	if err := checkName(name); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.sessions.Context(), cancel)()
	pfx := b.prefix + name + "/"
	const retryMin = 100 * time.Millisecond
	retry := retryMin
	for {
		rec, rev, err := b.leader(ctx, name)
		switch {
		case b.sessions.Closed():
			return baton.ErrClosed
		case ctx.Err() != nil:
			return ctx.Err()
		}
		fn(rec, err)
		if err != nil && !errors.Is(err, baton.ErrNoLeader) {
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
			retry = min(2*retry, b.cfg.TTL)
			continue
		}
		retry = retryMin
		b.waitChange(ctx, pfx, rev)
	}
}

// waitChange returns once a key under pfx may have changed after revision
// rev, or ctx ended, or the watch failed (compacted, say: the caller reads
// again and watches from there).
func (b *Backend) waitChange(ctx context.Context, pfx string, rev int64) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range b.client.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if len(wr.Events) > 0 || wr.Err() != nil {
			return
		}
	}
}
