package etcd

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// held is a lease this Backend holds.
type held struct {
	name, key string
	rev       int64
	sl        *backend.Slot
	s         *sess
	term      *backend.BasicTerm
	stop      context.CancelFunc // stops watching the key
}

// hold starts the term won at revision at.
func (b *Backend) hold(s *sess, sl *backend.Slot, name, key string, rev int64, ep uint64, at int64) (baton.Term, error) {
	ctx, stop := context.WithCancel(s.Context())
	h := &held{name: name, key: key, rev: rev, sl: sl, s: s, stop: stop}
	token := backend.EpochToken(ep, uint64(rev))
	// If Start fails, our key goes with the session: Close revokes it, or
	// it ends now if it has not yet.
	t, err := b.sessions.Start(s, sl, name, token, func(ctx context.Context) error { return b.release(ctx, h) }, backend.StartOptions{
		Started: func(t *backend.BasicTerm) { h.term = t },
		Watch:   func() { b.watchHeld(ctx, h, at+1) },
	})
	if err != nil {
		stop()
		return nil, err
	}
	b.log.Debug("acquired", "lease", name, "token", token, "rev", rev, "session", fmt.Sprintf("%x", s.ID))
	return &stateTerm{BasicTerm: t, b: b, h: h}, nil
}

// watchHeld ends h's term when its key is deleted after revision from. It
// returns when ctx ends: the term was released, or the session ended.
func (b *Backend) watchHeld(ctx context.Context, h *held, from int64) {
	defer b.sessions.Unclaim(h.sl)
	defer h.stop()
	lost := func(why string) {
		h.s.Forget(h.term)
		if h.term.End(fmt.Errorf("%w: lease %q: election key %s %s", baton.ErrLeaseLost, h.name, h.key, why)) {
			b.log.Info("lease lost", "lease", h.name, "token", h.rev, "why", why)
		}
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		for wr := range b.client.Watch(wctx, h.key, clientv3.WithRev(from)) {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != h.rev {
					cancel()
					lost("was deleted (by an operator, or by etcd expiring the session)")
					return
				}
			}
			if wr.Err() != nil {
				break
			}
			from = wr.Header.Revision + 1
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		// The watch ended without a verdict (compaction, or the client is
		// closing): look at the key itself before watching again.
		resp, err := b.client.Get(ctx, h.key)
		if err != nil {
			// The session's safe-until bounds how long this can go on.
			select {
			case <-ctx.Done():
			case <-time.After(b.cfg.RenewInterval / 4):
			}
			continue
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
			lost("is gone")
			return
		}
		from = resp.Header.Revision + 1
	}
}

// release is the term's release function: it deletes h's key if the key is
// still the one this term created.
func (b *Backend) release(ctx context.Context, h *held) error {
	h.stop()
	h.s.Forget(h.term)
	err := b.deleteKey(ctx, h.key, h.rev)
	if err != nil {
		// Our session keeps the key alive: left alone, it would block every
		// other candidate for as long as this Backend lives.
		b.cleanLater(h.s, h.sl, h.name, h.key, h.rev)
		return fmt.Errorf("%w: release lease %q (retrying in the background): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	b.log.Debug("released", "lease", h.name, "token", h.rev)
	b.sessions.Unclaim(h.sl)
	return nil
}
