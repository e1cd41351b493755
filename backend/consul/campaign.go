package consul

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

// Campaign implements baton.Backend. A second Campaign for a name this
// Backend already campaigns for or holds returns an error wrapping
// baton.ErrAlreadyCampaigning, whatever the candidate: the Backend's one
// session can hold a lease's key only once. A key held by something other
// than a lock (a `consul lock -n 2` semaphore) gives an error wrapping
// ErrKeyConflict. The term it returns implements baton.StateTerm: its
// state lives at StateKey(name).
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	key, err := b.Key(name)
	if err != nil {
		return nil, err
	}
	if c.ID == "" {
		return nil, fmt.Errorf("consul: candidate ID must not be empty (lease %q)", name)
	}
	return b.sessions.Campaign(ctx, name, c.ID, func(sl *backend.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, key, c.ID)
	})
}

// deleteOwn deletes key if session s holds it.
func (b *Backend) deleteOwn(ctx context.Context, s *sess, key string) error {
	for range 3 {
		p, err := b.get(ctx, key)
		if err != nil {
			return err
		}
		if p == nil || p.Session != s.ID {
			return nil
		}
		err = b.deleteCAS(ctx, key, p.ModifyIndex)
		if err == nil {
			b.log.Info("deleted a lock that a failed campaign's transaction took", "key", key, "index", p.ModifyIndex)
			return nil
		}
		if !errors.Is(err, errCASFailed) {
			return err
		}
	}
	return fmt.Errorf("consul: lock key %s keeps changing under our session", key)
}

// lockOutcome is what one attempt to lock a key came to.
type lockOutcome int

const (
	locked  lockOutcome = iota
	changed             // the key changed since it was read: read it again
	refused             // lock-delay, or our session is gone
)

func (b *Backend) campaign(ctx context.Context, sl *backend.Slot, name, key, id string) (baton.Term, error) {
	s, err := b.sessions.Session(ctx)
	if err != nil {
		return nil, err
	}
	a := &attempt{b: b, sl: sl, name: name, key: key, id: id, s: s, guard: guardKey(key)}
	defer func() {
		b.w.unsubscribe(a.sb) // nil once handed to the term
		if !a.won && (a.queued || a.dropLock) {
			b.cleanUp(a.s, sl, name, key, a.qkeyIfQueued(), a.pred, a.guardIfNotQueued(), a.dropLock, a.enqueueLost)
		}
	}()
	// The first look is one read, so that an uncontended campaign costs a
	// read and a transaction, and no watch or queue entry. A campaign that
	// finds the lock free and nobody in line takes it at once; otherwise
	// it joins the line.
	pair, tail, err := b.look(ctx, key)
	if err != nil {
		return nil, b.campaignErr(ctx, s, name, "read "+key, err)
	}
	a.st = state{pair: pair}
	first := pair != nil && pair.Flags != api.LockFlagValue // a conflict, which act reports
	if !first && (pair == nil || pair.Session == "") {
		if first, err = b.lineEmpty(ctx, tail); err != nil {
			return nil, b.campaignErr(ctx, s, name, "read the queue's last entry", err)
		}
	}
	known := true
	for {
		if !first {
			if err := a.waitTurn(ctx); err != nil {
				return nil, err
			}
			first = true
			// Judge the lock key by an answer from now on, not by what was
			// seen before waiting in line.
			known, a.retry = false, 0
			if err := a.watch(key); err != nil {
				return nil, err
			}
		}
		if known {
			if t, done, err := a.act(ctx); done {
				a.won = t != nil
				return t, err
			}
			if !a.queued {
				// Lost a race for a free lock, or the lock is held: wait in
				// line, where a release wakes only the first.
				first = false
				continue
			}
		}
		if err := a.wait(ctx); err != nil {
			return nil, err
		}
		known = true
	}
}

// attempt is a campaign's state between the watch's answers.
type attempt struct {
	b             *Backend
	sl            *backend.Slot
	name, key, id string
	s             *sess
	sb            *sub // the current subscription (the lock key, or the entry before ours in line); nil before the first wait, and once handed to the term

	st          state
	after       uint64        // the seq of the last state acted on
	retry       time.Duration // when positive: try again after this long even if nothing changed
	backoff     time.Duration // for lock-delays of unknown length
	holder      string        // the last session seen holding the key
	holderDelay time.Duration // its lock-delay, when known
	freedAt     time.Time     // when we saw holder's lock go
	newSession  bool          // a second session was started for this campaign

	queued   bool   // qkey is our entry in the lease's queue
	qkey     string // our queue entry's key, once queued
	qindex   uint64 // its index as we last wrote it
	pred     string // the key of the entry before ours in line ("" for none), as our entry's value says
	dropLock bool   // a lock transaction failed without a verdict: clean up its lock
	guard    string // what a lock from outside the line checks absent (see guardKey)
	// enqueueLost: the transaction that made qkey failed without a
	// verdict, and may still land (see cleanUp).
	enqueueLost bool
	won         bool // the campaign returned a term
}

// guardIfNotQueued returns the guard key, or "" when queued: a lock from
// the line checks our entry instead.
func (a *attempt) guardIfNotQueued() string {
	if a.queued {
		return ""
	}
	return a.guard
}

// qkeyIfQueued returns the key of our queue entry, or "" when not queued.
func (a *attempt) qkeyIfQueued() string {
	if !a.queued {
		return ""
	}
	return a.qkey
}

// act acts on the key's state as last seen, and reports done once the
// campaign won (a term) or failed (an error).
func (a *attempt) act(ctx context.Context) (baton.Term, bool, error) {
	b, s := a.b, a.s
	a.retry = 0
	switch p := a.st.pair; {
	case a.st.err != nil:
		return nil, true, b.campaignErr(ctx, s, a.name, "watch "+a.key, a.st.err)
	case p != nil && p.Flags != api.LockFlagValue:
		return nil, true, conflictErr(a.key, p.Flags)
	case p != nil && p.Session == s.ID:
		// Our session's lock without a term: the slot forbids it, but
		// should it happen, waiting would never end.
		b.log.Warn("deleting a lock of our session that no term holds", "lease", a.name, "key", a.key, "index", p.ModifyIndex)
		if err := b.deleteCAS(ctx, a.key, p.ModifyIndex); err != nil && !errors.Is(err, errCASFailed) {
			return nil, true, b.campaignErr(ctx, s, a.name, "delete "+a.key, err)
		}
		if a.sb != nil {
			b.w.refresh(a.sb) // we changed the key: look again, whatever it shows
		}
	case p != nil && p.Session != "":
		if p.Session != a.holder {
			a.holder, a.holderDelay, a.freedAt = p.Session, b.lockDelayOf(ctx, p.Session), time.Time{}
		}
	default:
		return a.lock(ctx, p)
	}
	return nil, false, nil
}

// lock tries to lock the key, free as last seen (p).
func (a *attempt) lock(ctx context.Context, p *api.KVPair) (baton.Term, bool, error) {
	b, s := a.b, a.s
	if a.holder != "" && a.freedAt.IsZero() {
		a.freedAt = time.Now()
	}
	// Should the lock lose a race (someone else's write came between the
	// state we act on and our transaction), the key may be back in that
	// state by the watch's next answer (locked and deleted again), which
	// would then not wake us: ask for that answer regardless. Asked before
	// the transaction, not after its failure, because the answer may
	// arrive in between, and would then be swallowed. A term that wins
	// ignores the one spurious wake-up.
	if a.sb != nil {
		b.w.refresh(a.sb)
	}
	index, ep, outcome, err := b.lock(ctx, s, a.name, a.key, a.id, p, a.qkeyIfQueued(), a.qindex, a.guard)
	if err != nil {
		// The transaction may have landed though its answer was lost (ctx
		// ended, a timeout, a dropped connection). Our session would then
		// hold the key with no term to release it, blocking every other
		// candidate for as long as this Backend lives.
		a.dropLock = !errors.Is(err, ErrPermissionDenied)
		return nil, true, b.campaignErr(ctx, s, a.name, "lock "+a.key, err)
	}
	switch outcome {
	case locked:
		a.queued = false // the transaction deleted our entry
		t, err := b.hold(s, a.sl, a.name, a.key, index, backend.EpochToken(ep, index), a.sb)
		a.sb = nil
		return t, true, err
	case changed:
		// Lost a race: the watch's next answer wakes us (see the refresh
		// above).
		return nil, false, nil
	}
	return a.refused(ctx)
}

// refused follows a lock that Consul refused: our session is gone (then a
// new one acts on the same state at once, once per campaign), or a
// lock-delay is in effect (then the next wait ends when it should be over).
func (a *attempt) refused(ctx context.Context) (baton.Term, bool, error) {
	b := a.b
	alive, err := b.alive(ctx, a.s)
	if err != nil {
		return nil, true, b.campaignErr(ctx, a.s, a.name, "look up session "+a.s.ID, err)
	}
	if !alive {
		b.sessions.Lost(a.s)
		if a.newSession {
			return nil, true, b.campaignErr(ctx, a.s, a.name, "lock "+a.key, errSessionGone)
		}
		a.newSession = true
		// Our entry in line, if any, went with the old session: join the
		// line again, at its end, rather than jump it.
		wasQueued := a.queued
		a.queued = false
		if a.s, err = b.sessions.Session(ctx); err != nil {
			return nil, true, err
		}
		if wasQueued {
			return nil, false, nil
		}
		return a.act(ctx)
	}
	// A lock-delay. Its end is known when we saw the lock of a session
	// whose delay we looked up go; otherwise back off.
	if a.holderDelay > 0 && !a.freedAt.IsZero() && a.backoff == 0 {
		a.retry = a.holderDelay - time.Since(a.freedAt) + 10*time.Millisecond
	}
	if a.retry <= 0 {
		a.backoff = min(max(2*a.backoff, 50*time.Millisecond), time.Second)
		a.retry = a.backoff
	}
	b.log.Debug("lock-delay in effect; trying again later", "lease", a.name, "key", a.key, "retry_in", a.retry)
	return nil, false, nil
}

// wait waits for the watch's next answer about the key, or for the retry
// time set by a lock-delay.
func (a *attempt) wait(ctx context.Context) error {
	b := a.b
	if a.sb == nil {
		if a.sb = b.w.subscribe(a.key); a.sb == nil {
			return baton.ErrClosed
		}
	}
	next, fresh, err := b.w.next(ctx, a.sb, a.after, a.retry, a.s.Context().Done())
	if err != nil {
		return b.campaignErr(ctx, a.s, a.name, "wait for "+a.key, err)
	}
	if fresh {
		if !samePair(next.pair, a.st.pair) {
			a.backoff = 0
		}
		a.st, a.after = next, next.seq
	}
	return nil
}

// lock tries once to lock key for candidate id with session s, provided
// key is still as seen (nil: absent). It returns the ModifyIndex Consul
// gave the key as it locked it, read from the transaction's own result so
// that no later write can be mistaken for it, and the lease's epoch, read
// in the same transaction (see epochKey). The same transaction deletes
// qkey, the campaign's queue entry, unless it is "", so that the next in
// line moves up as the lock is taken.
func (b *Backend) lock(ctx context.Context, s *sess, name, key, id string, seen *api.KVPair, qkey string, qindex uint64, gkey string) (uint64, uint64, lockOutcome, error) {
	guard := &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: key}
	if seen != nil {
		guard = &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: seen.ModifyIndex}
	}
	ekey := epochKey(key)
	ops := api.TxnOps{
		{KV: guard},
		{KV: &api.KVTxnOp{Verb: api.KVGet, Key: ekey}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Value: []byte(id), Flags: api.LockFlagValue, Session: s.ID}},
	}
	if qkey != "" {
		// Only while our entry is as we last wrote it: a lock whose
		// answer was lost may land after the campaign ended and released
		// its entry, and would then take the key with no term to release
		// it, for as long as the session lives.
		ops = append(ops,
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: qkey, Index: qindex}},
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: qkey}})
	} else {
		// Likewise from outside the line, while the guard is absent.
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: gkey}})
	}
	for range 3 {
		resp, ok, err := b.txn(ctx, ops)
		if err != nil {
			return 0, 0, 0, err
		}
		if !ok {
			noEpoch := false
			for _, e := range resp.Errors {
				switch e.OpIndex {
				case 0:
					return 0, 0, changed, nil
				case 1:
					noEpoch = true
				case 3:
					return 0, 0, 0, fmt.Errorf("consul: the campaign's entry in line (%q) or guard (%q) changed under it", qkey, gkey)
				}
			}
			if noEpoch {
				if err := b.createEpoch(ctx, name, ekey); err != nil {
					return 0, 0, 0, err
				}
				continue
			}
			// Consul checks lock-delays before the transaction reaches raft,
			// and a vanished session fails the lock op itself.
			return 0, 0, refused, nil
		}
		var (
			index uint64
			ep    *api.KVPair
		)
		for _, r := range resp.Results {
			switch kv := r.KV; {
			case kv == nil:
			case kv.Key == ekey:
				ep = &api.KVPair{Key: kv.Key, Value: kv.Value}
			case kv.Key == key && kv.Session == s.ID:
				index = kv.ModifyIndex
			}
		}
		if index == 0 {
			return 0, 0, 0, fmt.Errorf("consul: the transaction that locked %s returned no entry for it", key)
		}
		e, err := b.sawEpoch(name, ep)
		if err != nil {
			return 0, 0, 0, err
		}
		return index, e, locked, nil
	}
	return 0, 0, 0, fmt.Errorf("consul: epoch key %s keeps vanishing", ekey)
}

// campaignErr turns err into Campaign's error: ctx.Err() once ctx ended,
// baton.ErrClosed once the Backend is closed, ErrKeyConflict and
// ErrPermissionDenied as they are, and otherwise an error wrapping
// baton.ErrBackendUnavailable (with why the session ended, if it did).
func (b *Backend) campaignErr(ctx context.Context, s *sess, name, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if b.sessions.Closed() {
		return baton.ErrClosed
	}
	if errors.Is(err, ErrPermissionDenied) || errors.Is(err, ErrKeyConflict) {
		return fmt.Errorf("lease %q: %s: %w", name, what, err)
	}
	if serr := s.Err(); serr != nil {
		err = serr
	}
	return fmt.Errorf("%w: lease %q: %s: %w", baton.ErrBackendUnavailable, name, what, err)
}

func (b *Backend) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ttlErr *SessionTTLError
	if errors.Is(err, ErrPermissionDenied) || errors.As(err, &ttlErr) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", baton.ErrBackendUnavailable, what, err)
}
