package etcd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxTxnOps is how many keys one check reads in a transaction: etcd's
// default limit on the operations of a transaction (--max-txn-ops).
const maxTxnOps = 128

// heldWatch ends the term of a held key when etcd deletes the key (an
// operator, or etcd expiring the session). It watches every delete under
// the Backend's prefix with one watch, whatever the number of leases held,
// instead of a watch (two goroutines, and a create request that the client
// sends only after the previous one was answered) per key; puts are
// filtered out by the server. The watch runs while the Backend holds a
// lease. Safe for concurrent use.
//
// A delete of a held key at a revision above the key's create revision
// ends the term: the key of a held lease is never recreated while the
// term runs (a name is claimed by one campaign of the Backend at a time).
type heldWatch struct {
	b *Backend

	mu   sync.Mutex
	held map[string]*held // by key
	// sessions has the stop functions of the session-end hooks, one per
	// session with a held key: a session's end gives its names back.
	sessions map[*sess]struct{}
	// gen counts the watches started; a watch whose gen is not the current
	// one has been stopped and handles nothing more.
	gen     int
	running bool
	// start is the first revision the running watch delivers; deletes
	// before it were not seen, unless a check covered them.
	start int64
	// seen is the highest revision of a delete handled: a key held from
	// a revision below it may have been deleted unseen.
	seen int64
	// restart, while a watch is open, cancels it, so that the loop checks
	// every held key and watches again.
	restart context.CancelFunc
}

func newHeldWatch(b *Backend) *heldWatch {
	return &heldWatch{b: b, held: map[string]*held{}, sessions: map[*sess]struct{}{}}
}

// add watches h's key, which h's campaign found to be the oldest at
// revision at (so any delete of it is after at).
func (w *heldWatch) add(h *held, at int64) {
	w.mu.Lock()
	w.held[h.key] = h
	if _, ok := w.sessions[h.s]; !ok {
		s := h.s
		w.sessions[s] = struct{}{}
		context.AfterFunc(s.Context(), func() { w.sessionEnded(s) })
	}
	check := false
	switch {
	case !w.running:
		w.gen++
		gen, from := w.gen, at+1
		w.running, w.start = w.b.sessions.Go(func() { w.run(gen, from) }), from
	case w.start > at+1 || w.seen > at:
		// The running watch started after at, or has handled deletes
		// after it, before h was known: read the key itself.
		check = true
	}
	w.mu.Unlock()
	if check {
		w.check(h)
	}
}

// check reads h's key once; if it is gone, h's term ends. If the read
// fails, the watch restarts, which checks every held key, h's included.
func (w *heldWatch) check(h *held) {
	ctx, cancel := context.WithTimeout(h.s.Context(), w.b.cfg.RenewInterval)
	resp, err := w.b.client.Get(ctx, h.key)
	cancel()
	switch {
	case err != nil:
		w.mu.Lock()
		if w.restart != nil {
			w.restart()
		}
		w.mu.Unlock()
	case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev:
		if w.remove(h) {
			w.lost(h, "is gone")
		}
	}
}

// remove stops watching h's key, and reports whether it was watched.
func (w *heldWatch) remove(h *held) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.removeLocked(h)
}

func (w *heldWatch) removeLocked(h *held) bool {
	if w.held[h.key] != h {
		return false
	}
	delete(w.held, h.key)
	w.stopIfIdleLocked()
	return true
}

// stopIfIdleLocked stops the watch once no key is held.
func (w *heldWatch) stopIfIdleLocked() {
	if len(w.held) > 0 || !w.running {
		return
	}
	w.gen++
	w.running = false
	if w.restart != nil {
		w.restart()
		w.restart = nil
	}
}

// sessionEnded forgets the keys of s, whose terms ended with it (and whose
// keys go with it), and gives their names back.
func (w *heldWatch) sessionEnded(s *sess) {
	w.mu.Lock()
	var gone []*held
	for _, h := range w.held {
		if h.s == s {
			gone = append(gone, h)
			delete(w.held, h.key)
		}
	}
	delete(w.sessions, s)
	w.stopIfIdleLocked()
	w.mu.Unlock()
	for _, h := range gone {
		w.b.sessions.Unclaim(h.sl)
	}
}

// lost ends h's term with baton.ErrLeaseLost and gives its name back.
func (w *heldWatch) lost(h *held, why string) {
	h.s.Forget(h.term)
	if h.term.End(fmt.Errorf("%w: lease %q: election key %s %s", baton.ErrLeaseLost, h.name, h.key, why)) {
		w.b.log.Info("lease lost", "lease", h.name, "token", h.rev, "why", why)
	}
	w.b.sessions.Unclaim(h.sl)
}

// run is the watch of generation gen, from revision from, until it is
// stopped or the Backend closes. When the watch breaks (compaction, a
// lost connection, a restart) it checks every held key and watches again
// from the check's revision.
func (w *heldWatch) run(gen int, from int64) {
	ctx := w.b.sessions.Context()
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		w.mu.Lock()
		if w.gen != gen {
			w.mu.Unlock()
			cancel()
			return
		}
		w.restart = cancel
		w.mu.Unlock()
		for wr := range w.b.client.Watch(wctx, w.b.prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithFilterPut()) {
			if wr.Err() != nil {
				break
			}
			if !w.handle(gen, wr.Events) {
				cancel()
				return
			}
		}
		cancel()
		var ok bool
		if from, ok = w.resync(ctx, gen); !ok {
			return
		}
	}
}

// handle ends the terms whose keys events deleted, and reports whether
// the watch of generation gen is still wanted.
func (w *heldWatch) handle(gen int, events []*clientv3.Event) bool {
	w.mu.Lock()
	if w.gen != gen {
		w.mu.Unlock()
		return false
	}
	var gone []*held
	for _, ev := range events {
		if ev.Type != clientv3.EventTypeDelete {
			continue
		}
		w.seen = max(w.seen, ev.Kv.ModRevision)
		if h := w.held[string(ev.Kv.Key)]; h != nil && ev.Kv.ModRevision > h.rev {
			gone = append(gone, h)
			delete(w.held, h.key)
		}
	}
	w.stopIfIdleLocked()
	w.mu.Unlock()
	for _, h := range gone {
		w.lost(h, "was deleted (by an operator, or by etcd expiring the session)")
	}
	return true
}

// resync reads every held key, ends the terms whose keys are gone, and
// returns the revision to watch from: one past the oldest read. It holds
// the mutex throughout, so that no key is added unchecked meanwhile, and
// retries every RenewInterval/4 until it succeeds (each term's safe-until
// bounds how long it is blind), the watch is stopped, or the Backend
// closes (ok false then).
func (w *heldWatch) resync(ctx context.Context, gen int) (from int64, ok bool) {
	for {
		w.mu.Lock()
		if w.gen != gen {
			w.mu.Unlock()
			return 0, false
		}
		w.restart = nil
		if len(w.held) == 0 {
			w.stopIfIdleLocked()
			w.mu.Unlock()
			return 0, false
		}
		hs := make([]*held, 0, len(w.held))
		for _, h := range w.held {
			hs = append(hs, h)
		}
		rev, gone, err := w.read(ctx, hs)
		if err == nil {
			for _, h := range gone {
				delete(w.held, h.key)
			}
			w.start = rev + 1
			w.stopIfIdleLocked()
		}
		w.mu.Unlock()
		if err == nil {
			for _, h := range gone {
				w.lost(h, "is gone")
			}
			return rev + 1, true
		}
		w.b.log.Debug("checking the held election keys failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return 0, false
		case <-time.After(w.b.cfg.RenewInterval / 4):
		}
	}
}

// read reads the keys of hs (at least one), maxTxnOps at a time, and returns the oldest
// revision read at and the helds whose keys are gone.
func (w *heldWatch) read(ctx context.Context, hs []*held) (rev int64, gone []*held, err error) {
	for len(hs) > 0 {
		batch := hs[:min(len(hs), maxTxnOps)]
		hs = hs[len(batch):]
		ops := make([]clientv3.Op, len(batch))
		for i, h := range batch {
			ops[i] = clientv3.OpGet(h.key)
		}
		rctx, cancel := context.WithTimeout(ctx, w.b.cfg.RenewInterval)
		resp, err := w.b.client.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return 0, nil, err
		}
		if rev == 0 || resp.Header.Revision < rev {
			rev = resp.Header.Revision
		}
		for i, h := range batch {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != h.rev {
				gone = append(gone, h)
			}
		}
	}
	return rev, gone, nil
}
