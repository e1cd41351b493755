package consul

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

// queueName is the folder below a lease's prefix where its waiting
// candidates queue: Prefix + NAME + "/.baton-queue/SESSION.RANDOM", a key
// per waiting campaign, locked by that session (so that Consul releases it when
// the session ends), whose value is the key of the entry before it ("" for
// none). The key Prefix + NAME + "/.baton-tail" names the last entry; a
// waiter joins the line by moving it to its own entry, in a transaction
// that reads what it named before. Each waiter watches only the entry before its own, as etcd's
// concurrency.Election watches the key of the next lower revision and
// Curator's LeaderLatch the node of the next lower sequence number; only
// the first in line watches the lock key. A release then wakes one waiter,
// not every one, and no request of a waiter reads more than one entry,
// however long the line.
//
// The entry before ours went:
//   - deleted: it took the lease (the transaction that locks deletes the
//     winner's entry), so we are first in line;
//   - released (its session ended, or its campaign was cancelled, which
//     releases rather than deletes): its value names the entry before it,
//     which we watch instead, after deleting the released entry. A waiter
//     keeps its value naming the live entry before it, so that the chain
//     skips released entries for good.
//
// The queue orders baton's candidates only: the lock key alone decides who
// holds the lease, so `consul lock`, which knows nothing of the queue,
// still contends for the key beside the first in line. Its semaphore mode
// (-n N) counts the sessions of the keys under its prefix as alive, and
// ignores every other key; the queue's entries are no semaphore's
// contenders. Neither name begins with ".lock", so that a watch of the lock
// key, a prefix query, does not cover them.
const (
	queueName = ".baton-queue/"
	tailName  = ".baton-tail"
)

// queuePrefix is the folder of the queue of the lease whose lock key is
// key.
func queuePrefix(key string) string { return strings.TrimSuffix(key, lockKey) + queueName }

// tailKey is the key naming the last entry of the queue of the lease whose
// lock key is key.
func tailKey(key string) string { return strings.TrimSuffix(key, lockKey) + tailName }

// look reads, in one transaction, the lock key and the queue's tail key
// (each nil when absent). A transaction's get-tree, unlike its get, does
// not fail when nothing is there.
func (b *Backend) look(ctx context.Context, key string) (lock, tail *api.KVPair, err error) {
	tk := tailKey(key)
	resp, ok, err := b.txn(ctx, api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: key}},
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: tk}},
	})
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, txnErr(resp)
	}
	for _, r := range resp.Results {
		switch kv := r.KV; {
		case kv == nil:
		case kv.Key == key:
			lock = kvPair(kv)
		case kv.Key == tk:
			tail = kvPair(kv)
		}
	}
	return lock, tail, nil
}

// lineEmpty reports whether nobody alive waits in line, judging by the
// tail as looked at: none, or its entry gone or released. A released last
// entry with live ones before it makes a campaign take a free lock out of
// turn, which costs fairness only.
func (b *Backend) lineEmpty(ctx context.Context, tail *api.KVPair) (bool, error) {
	if tail == nil || len(tail.Value) == 0 {
		return true, nil
	}
	p, err := b.get(ctx, string(tail.Value))
	if err != nil {
		return false, err
	}
	return p == nil || p.Session == "", nil
}

// enqueue puts session s at the end of the queue of the lease whose lock
// key is key, and returns its entry's key and the key of the entry before
// it ("" for none). One transaction reads the tail key and moves it to our
// entry, so that joiners never contend: each gets the one before as its
// predecessor, in the order Consul applied them. ok is false when Consul
// refused the entry's lock: s is gone.
//
// Each campaign's entry has a key of its own, the session's ID and a
// random suffix, never used again: a campaign that left the line and
// joins it again must not bring its old entry, which a waiter may still
// watch, back to life at the end of the line, where that waiter would wait
// for something behind itself.
func (b *Backend) enqueue(ctx context.Context, s *sess, key string) (qkey, pred string, qindex uint64, ok bool, err error) {
	tk := tailKey(key)
	qkey = queuePrefix(key) + s.ID + "." + randomHex()
	resp, ok, err := b.txn(ctx, api.TxnOps{
		// A campaign whose enqueue's answer was lost leaves a released
		// entry at qkey if there was none (see cleanUp): the enqueue,
		// should it land after that, then changes nothing.
		{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: qkey}},
		{KV: &api.KVTxnOp{Verb: api.KVGetTree, Key: tk}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: tk, Value: []byte(qkey)}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: qkey, Session: s.ID}},
	})
	if err != nil || !ok {
		return qkey, "", 0, false, err
	}
	// Results come in the order of the ops: the tail as it was, if any,
	// then as set (to qkey), then our entry.
	tailSeen := false
	for _, r := range resp.Results {
		switch kv := r.KV; {
		case kv == nil:
		case kv.Key == tk && !tailSeen:
			pred, tailSeen = string(kv.Value), true
		case kv.Key == qkey:
			qindex = kv.ModifyIndex
		}
	}
	if pred == qkey {
		pred = "" // no tail before ours: the result is the set's
	}
	return qkey, pred, qindex, true, nil
}

// randomHex returns 12 random hexadecimal digits.
func randomHex() string {
	var r [6]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand)
	return hex.EncodeToString(r[:])
}

// guardKey returns a key, new each time, in the queue folder of the lease
// whose lock key is key, that no entry ever has: a campaign's lock from
// outside the line holds only while it is absent, and the campaign's
// clean-up puts a released entry there should that lock's answer be lost
// (see cleanUp).
func guardKey(key string) string { return queuePrefix(key) + "guard." + randomHex() }

// setPred records pred as the entry before ours (qkey, locked by s, last
// written at index), so that the waiter behind us finds it should we
// leave the line, and returns the entry's new index. The write holds only
// while the entry is as we last wrote it: a write whose answer was lost
// may still land after the campaign ended and released its entry, and
// would then lock it again, for as long as the session lives, holding up
// every waiter behind it. ok is false when Consul refused it.
func (b *Backend) setPred(ctx context.Context, s *sess, qkey, pred string, index uint64) (uint64, bool, error) {
	resp, ok, err := b.txn(ctx, api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: qkey, Index: index}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: qkey, Value: []byte(pred), Session: s.ID}},
	})
	if err != nil || !ok {
		return 0, false, err
	}
	// The check's result is the entry as it was; the lock's, last, as
	// written.
	if n := len(resp.Results); n > 0 {
		if kv := resp.Results[n-1].KV; kv != nil && kv.Key == qkey {
			return kv.ModifyIndex, true, nil
		}
	}
	return 0, false, fmt.Errorf("consul: the transaction that updated %s returned no entry for it", qkey)
}

// gone reports whether st, a state of pred's key, shows it deleted or
// released. An absent key counts only in an answer no older than when
// pred was read (at index).
func gone(st state, index uint64) bool {
	if p := st.pair; p != nil {
		return p.Session == ""
	}
	return st.current || st.index >= index
}

// waitTurn waits in the lease's queue until no live entry is before ours,
// joining the queue first if the campaign is not in it. On return the
// campaign is first in line.
func (a *attempt) waitTurn(ctx context.Context) error {
	b := a.b
	for {
		if !a.queued {
			qkey, pred, qindex, ok, err := b.enqueue(ctx, a.s, a.key)
			if err != nil {
				// The transaction may have landed though its answer was
				// lost (ctx ended, a timeout, a dropped connection): our
				// entry would then stand in line, locked by our live
				// session, and every waiter behind it wait for as long as
				// this Backend lives. The campaign's clean-up releases it
				// (a release of an entry that is not there is refused,
				// which is as good).
				a.qkey, a.pred, a.queued, a.enqueueLost = qkey, "", true, true
				return b.campaignErr(ctx, a.s, a.name, "join the queue "+queuePrefix(a.key), err)
			}
			if !ok {
				if err := a.sessionRefused(ctx, "join the queue "+queuePrefix(a.key)); err != nil {
					return err
				}
				continue
			}
			a.qkey, a.qindex, a.pred, a.queued = qkey, qindex, "", true
			if pred != "" {
				// Should we leave the line, the waiter behind us moves up
				// to the entry our value names.
				index, ok, err := b.setPred(ctx, a.s, a.qkey, pred, a.qindex)
				if err != nil {
					return b.campaignErr(ctx, a.s, a.name, "update "+a.qkey, err)
				}
				if !ok {
					if err := a.sessionRefused(ctx, "update "+a.qkey); err != nil {
						return err
					}
					continue
				}
				a.pred, a.qindex = pred, index
			}
		}
		// Walk back past released entries to a live one, or to none.
		moved := false
		var at uint64
		for a.pred != "" {
			p, err := b.get(ctx, a.pred)
			if err != nil {
				return b.campaignErr(ctx, a.s, a.name, "read "+a.pred, err)
			}
			if p == nil {
				a.pred, moved = "", true // it took the lease: we are first
				break
			}
			if p.Session != "" {
				at = p.ModifyIndex
				break
			}
			// Best effort: should it fail, the entry stays, released, and
			// costs the waiter behind us a read more.
			if err := b.deleteCAS(ctx, p.Key, p.ModifyIndex); err == nil {
				b.log.Debug("deleted a queue entry that left the line", "key", p.Key)
			}
			a.pred, moved = string(p.Value), true
		}
		// Our value must name the live entry before us, for the waiter
		// behind us to move up to should we leave. When there is none, the
		// entry it names was deleted as it took the lease, which tells the
		// same, and the write, which would wake the waiter behind us, is
		// left out.
		if moved && a.pred != "" {
			index, ok, err := b.setPred(ctx, a.s, a.qkey, a.pred, a.qindex)
			if err != nil {
				return b.campaignErr(ctx, a.s, a.name, "update "+a.qkey, err)
			}
			if !ok {
				if err := a.sessionRefused(ctx, "update "+a.qkey); err != nil {
					return err
				}
				continue
			}
			a.qindex = index
		}
		if a.pred == "" {
			return nil
		}
		// A subscription of its own, which the watcher drops as soon as
		// an answer shows the entry gone (see sub.last), so that no query
		// is issued for it only to be abandoned.
		a.b.w.unsubscribe(a.sb)
		if a.sb = a.b.w.subscribeUntil(a.pred, func(st state) bool { return gone(st, at) }); a.sb == nil {
			return fmt.Errorf("consul: %w", errStopped)
		}
		for {
			st, _, err := b.w.next(ctx, a.sb, a.after, 0, a.s.Context().Done())
			if err != nil {
				return b.campaignErr(ctx, a.s, a.name, "wait for "+a.pred, err)
			}
			a.after = st.seq
			if st.err != nil {
				return b.campaignErr(ctx, a.s, a.name, "watch "+a.pred, st.err)
			}
			if gone(st, at) {
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

// cleanUp undoes what a campaign that ends without a term may have left:
// it releases its queue entry qkey (if not ""), keeping its value, the
// entry before it, for the waiter behind it to move up to, and, when lock
// is set, deletes the lease's lock key if session s holds it (a lock
// transaction failed without a verdict). The campaign holds the name's slot, so that such a lock can
// only be that transaction's. It tries once, bounded by RenewInterval (the
// campaign's ctx may be what ended, and Campaign should not outlive it by
// much), and then keeps trying in the background, holding the slot, until
// it succeeds or the session ends (which takes the lock and releases the
// entry), as etcd's dropKey does. An entry left behind would hold up the
// waiter behind it for as long as the session lives. enqueueLost says that
// the transaction making qkey failed without a verdict.
func (b *Backend) cleanUp(s *sess, sl *backend.Slot, name, key, qkey, pred, guard string, lock, enqueueLost bool) {
	if s.Context().Err() != nil {
		return
	}
	// What a lock whose answer was lost needs, should it land yet, is
	// made to fail first (our entry released, or the guard put there), and
	// only then is the key read and deleted if ours: the other order would
	// let it land in between.
	clean := func(ctx context.Context) error {
		if qkey != "" {
			// A refusal leaves nothing to do: the session is gone (Consul
			// released the entry), or so is the entry (deleted by a lock
			// transaction whose answer was lost, or by the waiter behind
			// it once released) -- unless the enqueue's answer was lost:
			// the entry may not be made yet, and the enqueue still land.
			// A released entry put there first makes it change nothing
			// (see enqueue); it is left there, released, in no one's way.
			_, ok, err := b.txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: qkey, Value: []byte(pred), Session: s.ID}}})
			if err != nil {
				return err
			}
			if !ok && enqueueLost {
				b.addTomb(s.ID, qkey)
				if _, _, err := b.txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: qkey, Index: 0}}}); err != nil {
					return err
				}
			}
			qkey = ""
		}
		if lock {
			if guard != "" {
				b.addTomb(s.ID, guard)
				if _, _, err := b.txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: guard, Index: 0}}}); err != nil {
					return err
				}
				guard = ""
			}
			if err := b.deleteOwn(ctx, s, key); err != nil {
				return err
			}
			lock = false
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

// addTomb records key, a released key about to be put where a write of
// session id whose answer was lost might still land, for sweepTombs. It is
// recorded before it is written, so that a sweep after a write that failed
// without a verdict deletes it too.
func (b *Backend) addTomb(id, key string) {
	b.tmu.Lock()
	defer b.tmu.Unlock()
	b.tombs[id] = append(b.tombs[id], key)
}

// sweepTombs deletes the released keys recorded for session id, which the
// servers no longer have: a write of the session landing late is then
// refused (its lock names a session that does not exist), so the keys
// guard nothing any more. Best effort: a key left is in no one's way.
func (b *Backend) sweepTombs(ctx context.Context, id string) {
	b.tmu.Lock()
	keys := b.tombs[id]
	delete(b.tombs, id)
	b.tmu.Unlock()
	for len(keys) > 0 {
		n := min(len(keys), 64)
		ops := make(api.TxnOps, 0, n)
		for _, k := range keys[:n] {
			ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: k}})
		}
		keys = keys[n:]
		if _, _, err := b.txn(ctx, ops); err != nil {
			b.log.Debug("could not delete released queue keys of a session that ended", "session", id, "keys", n, "err", err)
			return
		}
	}
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
