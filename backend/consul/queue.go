package consul

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

// queueName is the folder below a lease's prefix where its waiting
// candidates queue: Prefix + NAME + "/.baton-queue/SESSION", a key per
// waiting session, locked by that session (so that Consul releases it when
// the session ends) and ordered by CreateIndex. Each waiter watches only
// the entry just before its own, as etcd's concurrency.Election watches the
// key of the next lower revision and Curator's LeaderLatch the node of the
// next lower sequence number; only the first in line watches the lock key.
// A release then wakes one waiter, not every one.
//
// The queue orders baton's candidates only: the lock key alone decides who
// holds the lease, so `consul lock`, which knows nothing of the queue,
// still contends for the key beside the first in line. Its semaphore mode
// (-n N) counts the sessions of the keys under its prefix as alive, and
// ignores every other key; the queue's entries are no semaphore's
// contenders. The name does not begin with ".lock", so that a watch of the
// lock key, a prefix query, does not cover it.
const queueName = ".baton-queue/"

// queuePrefix is the folder of the queue of the lease whose lock key is
// key.
func queuePrefix(key string) string { return strings.TrimSuffix(key, lockKey) + queueName }

// look reads, in one transaction, the lock key (nil when absent) and the
// entries of the lease's queue. A transaction's get-tree, unlike its get,
// does not fail when nothing is there.
func (b *Backend) look(ctx context.Context, key string) (*api.KVPair, []*api.KVPair, error) {
	qp := queuePrefix(key)
	resp, ok, err := b.txn(ctx, api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: key}},
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: qp}},
	})
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, txnErr(resp)
	}
	var lock *api.KVPair
	var queue []*api.KVPair
	for _, r := range resp.Results {
		switch kv := r.KV; {
		case kv == nil:
		case kv.Key == key:
			lock = kvPair(kv)
		case strings.HasPrefix(kv.Key, qp):
			queue = append(queue, kvPair(kv))
		}
	}
	return lock, queue, nil
}

// enqueue puts session s at the end of the queue of the lease whose lock
// key is key, and returns its entry's key and the queue as it then was. A
// leftover entry of s is deleted first, so that the new one is created
// anew, at the end. ok is false when Consul refused the entry's lock: s is
// gone.
func (b *Backend) enqueue(ctx context.Context, s *sess, key string) (qkey string, queue []*api.KVPair, ok bool, err error) {
	qp := queuePrefix(key)
	qkey = qp + s.ID
	resp, ok, err := b.txn(ctx, api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: qkey}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: qkey, Session: s.ID}},
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: qp}},
	})
	if err != nil || !ok {
		return qkey, nil, false, err
	}
	for _, r := range resp.Results {
		if kv := r.KV; kv != nil && strings.HasPrefix(kv.Key, qp) {
			queue = append(queue, kvPair(kv))
		}
	}
	return qkey, dedupe(queue), true, nil
}

// dedupe keeps the last entry of each key: a transaction's results list the
// key it locked twice, as locked and as read.
func dedupe(queue []*api.KVPair) []*api.KVPair {
	seen := map[string]int{}
	var out []*api.KVPair
	for _, p := range queue {
		if i, ok := seen[p.Key]; ok {
			out[i] = p
			continue
		}
		seen[p.Key] = len(out)
		out = append(out, p)
	}
	return out
}

// listQueue reads the queue of the lease whose lock key is key.
func (b *Backend) listQueue(ctx context.Context, key string) ([]*api.KVPair, error) {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	pairs, _, err := b.kv.List(queuePrefix(key), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	return pairs, permissionErr(err)
}

// place finds qkey's place in queue: the live entry just before it (nil
// when qkey is first in line), and whether qkey is in the queue at all.
// Entries whose session ended (Consul released them) are skipped; those
// between the one before and qkey are deleted, so that dead entries do not
// pile up: each is deleted by the first live waiter behind it.
func (b *Backend) place(ctx context.Context, qkey string, queue []*api.KVPair) (pred *api.KVPair, in bool) {
	queue = slices.Clone(queue)
	slices.SortFunc(queue, func(x, y *api.KVPair) int {
		switch {
		case x.CreateIndex < y.CreateIndex:
			return -1
		case x.CreateIndex > y.CreateIndex:
			return 1
		}
		return strings.Compare(x.Key, y.Key)
	})
	var dead []*api.KVPair
	for _, p := range queue {
		switch {
		case p.Key == qkey:
			in = p.Session != ""
			for _, d := range dead {
				// Best effort: the next waiter behind it tries again.
				if err := b.deleteCAS(ctx, d.Key, d.ModifyIndex); err == nil {
					b.log.Debug("deleted a queue entry whose session ended", "key", d.Key)
				}
			}
			return pred, in
		case p.Session == "":
			dead = append(dead, p)
		default:
			pred, dead = p, nil
		}
	}
	return nil, false
}

// gone reports whether st, a state of the key of pred (an entry of the
// queue as listed), shows that entry gone or released. An absent key
// counts only in an answer no older than the listing.
func gone(st state, pred *api.KVPair) bool {
	if p := st.pair; p != nil {
		return p.Session == "" || p.CreateIndex != pred.CreateIndex
	}
	return st.current || st.index >= pred.ModifyIndex
}

// waitTurn waits in the lease's queue until no live entry is before ours,
// joining the queue first if the campaign is not in it. On return the
// campaign is first in line.
func (a *attempt) waitTurn(ctx context.Context) error {
	b := a.b
	for {
		var queue []*api.KVPair
		if !a.queued {
			qkey, q, ok, err := b.enqueue(ctx, a.s, a.key)
			if err != nil {
				return b.campaignErr(ctx, a.s, a.name, "join the queue "+queuePrefix(a.key), err)
			}
			if !ok {
				if err := a.sessionRefused(ctx, "join the queue "+queuePrefix(a.key)); err != nil {
					return err
				}
				continue
			}
			a.qkey, a.queued, queue = qkey, true, q
		} else {
			q, err := b.listQueue(ctx, a.key)
			if err != nil {
				return b.campaignErr(ctx, a.s, a.name, "read the queue "+queuePrefix(a.key), err)
			}
			queue = q
		}
		pred, in := b.place(ctx, a.qkey, queue)
		if !in {
			// Our entry is gone (deleted by hand) or was released (our
			// session ended): join again.
			a.queued = false
			continue
		}
		if pred == nil {
			return nil
		}
		if err := a.watch(pred.Key); err != nil {
			return err
		}
		for {
			st, _, err := b.w.next(ctx, a.sb, a.after, 0, a.s.Context().Done())
			if err != nil {
				return b.campaignErr(ctx, a.s, a.name, "wait for "+pred.Key, err)
			}
			a.after = st.seq
			if st.err != nil {
				return b.campaignErr(ctx, a.s, a.name, "watch "+pred.Key, st.err)
			}
			if gone(st, pred) {
				break
			}
		}
	}
}

// sessionRefused follows a write that Consul refused for want of our
// session: if the session is gone, the campaign goes on with a new one,
// once.
func (a *attempt) sessionRefused(ctx context.Context, what string) error {
	b := a.b
	alive, err := b.alive(ctx, a.s)
	if err != nil {
		return b.campaignErr(ctx, a.s, a.name, "look up session "+a.s.ID, err)
	}
	if alive {
		return b.campaignErr(ctx, a.s, a.name, what, errors.New("consul refused the lock of our own queue entry, and our session is alive"))
	}
	b.sessions.Lost(a.s)
	if a.newSession {
		return b.campaignErr(ctx, a.s, a.name, what, errSessionGone)
	}
	a.newSession = true
	// The entry, if any, went with the old session.
	a.queued = false
	a.s, err = b.sessions.Session(ctx)
	return err
}

// watch makes the campaign's subscription one to key.
func (a *attempt) watch(key string) error {
	if a.sb != nil && a.sb.key == key {
		return nil
	}
	a.b.w.unsubscribe(a.sb)
	if a.sb = a.b.w.subscribe(key); a.sb == nil {
		return fmt.Errorf("consul: %w", errStopped)
	}
	return nil
}

// cleanUp deletes what a campaign that ends without a term may have left:
// its queue entry qkey (if not ""), and, when lock is set, the lease's
// lock key if session s holds it (a lock transaction failed without a
// verdict). The campaign holds the name's slot, so that such a lock can
// only be that transaction's. It tries once, bounded by RenewInterval (the
// campaign's ctx may be what ended, and Campaign should not outlive it by
// much), and then keeps trying in the background, holding the slot, until
// it succeeds or the session ends (which takes the lock and releases the
// entry), as etcd's dropKey does. An entry left behind would hold up the
// waiter behind it for as long as the session lives.
func (b *Backend) cleanUp(s *sess, sl *backend.Slot, name, key, qkey string, lock bool) {
	if s.Context().Err() != nil {
		return
	}
	clean := func(ctx context.Context) error {
		if lock {
			if err := b.deleteOwn(ctx, s, key); err != nil {
				return err
			}
			lock = false
		}
		if qkey != "" {
			if err := b.deleteKey(ctx, qkey); err != nil {
				return err
			}
			qkey = ""
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(s.Context(), b.cfg.RenewInterval)
	err := clean(ctx)
	cancel()
	if err == nil {
		return
	}
	b.log.Warn("could not clean up after a campaign; retrying in the background", "lease", name, "key", key, "err", err)
	// Close destroys the session, and the lock and entry with it.
	b.sessions.CleanClaimed(sl, func() {
		backend.Retry(s.Context(), b.cfg.RenewInterval, b.reqTimeout, false, func(ctx context.Context) error {
			err := clean(ctx)
			if err != nil {
				b.log.Debug("campaign not cleaned up yet", "lease", name, "key", key, "err", err)
			}
			return err
		})
	})
}

// deleteKey deletes key.
func (b *Backend) deleteKey(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	_, err := b.kv.Delete(key, (&api.WriteOptions{}).WithContext(ctx))
	return permissionErr(err)
}

// kvPair copies a transaction's result entry.
func kvPair(kv *api.KVPair) *api.KVPair {
	p := *kv
	return &p
}

// txnErr describes a transaction Consul refused.
func txnErr(resp api.TxnResponse) error {
	var whats []string
	for _, e := range resp.Errors {
		whats = append(whats, e.What)
	}
	return fmt.Errorf("consul: transaction failed: %s", strings.Join(whats, "; "))
}
