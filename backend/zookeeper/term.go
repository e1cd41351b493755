package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// held is a lease this Backend holds.
type held struct {
	name  string
	n     *node
	path  string
	czxid int64
	sl    *backend.Slot
	s     *sess
	term  *backend.BasicTerm
	ctx   context.Context    // ends with the term: bounds setting its watch
	stop  context.CancelFunc // ends ctx

	mu       sync.Mutex
	released bool // Resign took over the node's deletion
	gone     bool // lose ended the term: the node is known to be gone

	// checking says a goroutine sets the node's watch; again, that an
	// event came meanwhile, so it sets it once more. Guarded by
	// heldWatch.mu.
	checking, again bool
}

// hold starts the term of node n.
func (b *Backend) hold(s *sess, sl *backend.Slot, name string, n *node, czxid int64, ep uint64) (baton.Term, error) {
	ctx, stop := context.WithCancel(s.Context())
	h := &held{name: name, n: n, path: b.nodePath(n), czxid: czxid, sl: sl, s: s, ctx: ctx, stop: stop}
	token := backend.EpochToken(ep, uint64(czxid))
	// No goroutine per term: the session's timer ends it at its
	// safe-until, heldWatch sees its node go, and ended runs once it ends.
	t, err := b.sessions.Start(s, sl, name, token, func(ctx context.Context) error { return b.release(ctx, h) }, backend.StartOptions{
		Started: func(t *backend.BasicTerm) { h.term = t },
	})
	if err != nil {
		stop()
		if !errors.Is(err, baton.ErrClosed) {
			// The session may still be alive on the server, holding our
			// node. (Once closed, Close deletes it, or closes the session.)
			b.dropNode(sl, name, n)
		}
		return nil, err
	}
	b.watch.add(h)
	t.AfterEnd(func() { b.ended(h) })
	b.log.Debug("acquired", "lease", name, "token", token, "czxid", czxid, "node", h.path, "session", fmt.Sprintf("0x%x", s.ID.id))
	return &term{BasicTerm: t, b: b, h: h}, nil
}

// lose ends h's term with baton.ErrLeaseLost, its node being gone, and
// frees the lease name. heldWatch calls it when it sees the node go, and
// StoreState when the store refused a write because the node was gone.
func (b *Backend) lose(h *held, why string) {
	h.mu.Lock()
	h.gone = true
	h.mu.Unlock()
	b.watch.remove(h)
	h.s.Forget(h.term)
	if h.term.End(fmt.Errorf("%w: lease %q: latch node %s %s", baton.ErrLeaseLost, h.name, h.path, why)) {
		b.log.Info("lease lost", "lease", h.name, "token", h.czxid, "why", why)
	}
	b.forget(h.n)
	b.sessions.Unclaim(h.sl)
	h.stop()
}

// ended runs once h's term ended, however it ended: released or lost, or
// its session generation ended at safe-until, or the session's timer
// ended the term there. In those last cases the node may outlive the term
// (the session may still be alive on the server, or come back), so it is
// deleted in the background.
func (b *Backend) ended(h *held) {
	b.watch.remove(h)
	h.stop()
	h.mu.Lock()
	// Resign ends the term before it calls release, so the term's error
	// may say so first.
	released := h.released || errors.Is(h.term.Err(), baton.ErrResigned)
	gone := h.gone
	h.mu.Unlock()
	switch {
	case gone:
		// The watch or StoreState found the node gone, and lose did the rest.
	case released:
		// release deletes the node.
	case b.isClosed():
		// Close deletes the node, or closes the session.
		b.sessions.Unclaim(h.sl)
	default:
		// The term reached its safe-until without a confirmed renewal.
		// The session may live on on the server, and our node with it:
		// left alone it would keep the lease from every other candidate.
		h.s.Forget(h.term)
		b.cleanLater(h.sl, h.name, h.n, nil)
	}
}

// setWatch sets a data watch on h's node, unless the node is gone or was
// replaced (then it returns why the term is lost), and returns the
// watch's channel; nil once the term ended.
func (b *Backend) setWatch(h *held) (string, <-chan zk.Event) {
	type watched struct {
		stat *zk.Stat
		ch   <-chan zk.Event
	}
	for h.ctx.Err() == nil && h.term.Err() == nil {
		// While the client is cut off this waits for it to come back (or
		// the term to end): the node cannot be deleted before.
		w, err := call(h.ctx, b, func() (watched, error) {
			_, st, ch, err := b.conn.GetW(h.path)
			return watched{st, ch}, err
		})
		switch {
		case h.ctx.Err() != nil:
		case errors.Is(err, zk.ErrNoNode):
			return deleted, nil
		case errors.Is(err, zk.ErrSessionExpired):
			return expiredWith, nil
		case err != nil:
			// The client failed the request while reconnecting: ask again
			// once it may be back.
			select {
			case <-h.ctx.Done():
			case <-h.term.Done():
			case <-time.After(b.cfg.RenewInterval / 4):
			}
		case w.stat.Czxid != h.czxid:
			return "was replaced by another node", nil
		default:
			return "", w.ch
		}
	}
	return "", nil
}

// release is the term's release function: it deletes h's node.
func (b *Backend) release(ctx context.Context, h *held) error {
	h.mu.Lock()
	h.released = true
	h.mu.Unlock()
	h.stop()
	b.watch.remove(h)
	h.s.Forget(h.term)
	if err := b.deleteNode(ctx, h.n); err != nil {
		// Our session keeps the node alive: left alone, it would block
		// every other candidate for as long as the session lives.
		b.cleanLater(h.sl, h.name, h.n, nil)
		return fmt.Errorf("%w: release lease %q (retrying in the background): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	b.log.Debug("released", "lease", h.name, "token", h.czxid)
	b.sessions.Unclaim(h.sl)
	return nil
}
