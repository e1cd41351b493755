package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// held is a lease this Backend holds.
type held struct {
	name, key string
	index     uint64 // the lock key's ModifyIndex as the term locked it
	token     uint64
	sl        *backend.Slot
	s         *sess
	sub       *sub
	term      *backend.BasicTerm
	ctx       context.Context
	stop      context.CancelFunc // stops watching the key

	judged atomic.Bool // judge found the lock gone

	mu       sync.Mutex // serialises letting go of the lock
	let      bool       // the lock is gone
	finished bool       // the name was freed
}

// hold starts the term won with token, locking key at index. sb is the
// campaign's subscription to the key, or nil; hold takes it over.
func (b *Backend) hold(s *sess, sl *backend.Slot, name, key string, index, token uint64, sb *sub) (baton.Term, error) {
	ctx, stop := context.WithCancel(s.Context())
	h := &held{name: name, key: key, index: index, token: token, sl: sl, s: s, ctx: ctx, stop: stop}
	// If Start fails, the lock goes with the session: Close destroys it,
	// or it ends now if it has not yet. No goroutine per term: the
	// session's timer ends it at its safe-until, and the watcher's one
	// query calls judge with each new state of the key.
	t, err := b.sessions.Start(s, sl, name, token, func(ctx context.Context) error { return b.release(ctx, h) }, backend.StartOptions{
		UntilGone: true,
		Started: func(t *backend.BasicTerm) {
			if sb == nil {
				sb = b.w.subscribe(key) // not nil: the watcher closes only after the sessions did
			} else {
				b.w.rebase(sb)
			}
			h.term, h.sub = t, sb
			b.hmu.Lock()
			b.helds[h] = struct{}{}
			b.hmu.Unlock()
		},
	})
	if err != nil {
		stop()
		b.w.unsubscribe(sb)
		return nil, err
	}
	// Once the term was released or lost, or the session ended:
	context.AfterFunc(ctx, func() {
		b.w.unsubscribe(h.sub)
		b.forget(h)
		if h.s.Context().Err() != nil {
			b.finish(h) // the lock went with the session
		}
	})
	b.judge(h, b.w.onChange(h.sub, func(st state) { b.judge(h, st) }))
	b.log.Debug("acquired", "lease", name, "token", token, "session", s.ID)
	return &term{BasicTerm: t, b: b, h: h, state: strings.TrimSuffix(key, lockKey) + stateKey}, nil
}

// judge ends h's term when st, a state of its key, says that the key is no
// longer this term's lock. It does not block: letting go of what is left
// of the lock runs in a goroutine.
func (b *Backend) judge(h *held, st state) {
	if st.seq == 0 || st.err != nil || h.ctx.Err() != nil {
		return // the renewals' safe-until bounds how long we can be blind
	}
	var why string
	switch p := st.pair; {
	case p != nil && p.ModifyIndex < h.index:
		return // an answer from before we won
	case p != nil && p.ModifyIndex == h.index && p.Session == h.s.ID:
		return
	case p == nil && !st.current:
		return // may be from before we won
	case p == nil:
		why = "was deleted"
	case p.Session == "":
		why = "was released (its session was invalidated or destroyed)"
	case p.Session != h.s.ID:
		why = "is locked by session " + p.Session
	default:
		why = "was overwritten while locked (a plain write keeps the lock but changes its index)"
	}
	if !h.judged.CompareAndSwap(false, true) {
		return
	}
	lose := func() {
		b.lost(h, why)
		h.stop()
	}
	if !b.sessions.Go(lose) {
		h.stop() // closed: Close lets go of the lock
	}
}

// lost ends h's term with baton.ErrLeaseLost and lets go of whatever of
// the key is still ours.
func (b *Backend) lost(h *held, why string) {
	h.s.Forget(h.term)
	if h.term.End(fmt.Errorf("%w: lease %q: lock key %s %s", baton.ErrLeaseLost, h.name, h.key, why)) {
		b.log.Info("lease lost", "lease", h.name, "token", h.token, "why", why)
	}
	ctx, cancel := context.WithTimeout(h.s.Context(), b.reqTimeout)
	err := b.letGo(ctx, h)
	cancel()
	if err != nil {
		b.cleanLater(h)
	}
}

func (b *Backend) forget(h *held) {
	b.hmu.Lock()
	delete(b.helds, h)
	b.hmu.Unlock()
}

// finish frees h's lease name for new campaigns, once h's lock is gone.
func (b *Backend) finish(h *held) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b.finishLocked(h)
}

func (b *Backend) finishLocked(h *held) {
	if h.finished {
		return
	}
	h.finished = true
	b.sessions.Gone(h.sl)
}

// release is the term's release function: it deletes h's key if the key is
// still this term's lock, which wakes every waiter's blocking query.
func (b *Backend) release(ctx context.Context, h *held) error {
	h.stop()
	h.s.Forget(h.term)
	b.forget(h)
	if err := b.letGo(ctx, h); err != nil {
		// Our session keeps the lock: left alone, it would block every
		// other candidate for as long as this Backend lives.
		b.cleanLater(h)
		return fmt.Errorf("%w: release lease %q (retrying in the background): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	b.log.Debug("released", "lease", h.name, "token", h.token)
	return nil
}

// letGo removes this term's lock on h.key, once, and then frees the name:
// it deletes the key if it is still the version the term locked, or, if a
// plain write changed the key while our session kept it locked, that
// version. Deleting rather than releasing (as api.Lock.Unlock does) also
// cleans the key up, as `consul lock` does after unlocking; and an explicit
// delete, unlike a destroyed session, incurs no lock-delay. The name stays
// claimed until then, so that a lock of our session on the key can only be
// this term's. Once the session has ended there is nothing to do: the lock
// went with it (or goes when the session is destroyed or expires), and a
// new session never mistakes it for its own.
func (b *Backend) letGo(ctx context.Context, h *held) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.let {
		return nil
	}
	err := b.deleteLock(ctx, h)
	if err != nil && h.s.Context().Err() == nil {
		return err
	}
	h.let = true
	b.finishLocked(h)
	return nil
}

func (b *Backend) deleteLock(ctx context.Context, h *held) error {
	// Once the session has ended there is nothing left to delete (see
	// letGo): stop waiting then, so that Close, which lets go of its terms'
	// locks before it ends their session, waits at most until the
	// session's safe-until for an agent that does not answer.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(h.s.Context(), cancel)()
	index := h.index
	for range 3 {
		// deleteCAS and get bound each request by reqTimeout, like every
		// other request of the Backend: ctx may have no deadline (Resign or
		// Close with context.Background()), and a request to an agent that
		// vanished would otherwise hang for as long as TCP takes to give
		// up, holding h.mu, and with it Close.
		err := b.deleteCAS(ctx, h.key, index)
		if !errors.Is(err, errCASFailed) {
			return err // nil: deleted
		}
		p, err := b.get(ctx, h.key)
		if err != nil {
			return err
		}
		if p == nil || p.Session != h.s.ID || p.ModifyIndex < h.index {
			return nil // gone, or no longer ours
		}
		index = p.ModifyIndex
	}
	return fmt.Errorf("consul: lock key %s keeps changing under our session", h.key)
}

// cleanLater retries letGo every RenewInterval until it succeeds or the
// session ends (which releases the lock too). Once the Backend is closed,
// Close lets go of the lock, or destroys the session.
func (b *Backend) cleanLater(h *held) {
	b.sessions.CleanLater(nil, func() {
		ok := backend.Retry(h.s.Context(), b.cfg.RenewInterval, b.reqTimeout, false, func(ctx context.Context) error {
			err := b.letGo(ctx, h)
			if err != nil {
				b.log.Debug("leftover lock not let go yet", "lease", h.name, "key", h.key, "err", err)
			}
			return err
		})
		if !ok {
			b.finish(h)
			return
		}
		b.log.Info("let go of a leftover lock", "lease", h.name, "key", h.key)
	})
}
