package etcd

import (
	"context"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// held is a lease this Backend holds.
type held struct {
	name, key string
	rev       int64
	sl        *backend.Slot
	s         *sess
	term      *backend.BasicTerm
}

// hold starts the term won at revision at.
func (b *Backend) hold(s *sess, sl *backend.Slot, name, key string, rev int64, ep uint64, at int64) (baton.Term, error) {
	h := &held{name: name, key: key, rev: rev, sl: sl, s: s}
	token := backend.EpochToken(ep, uint64(rev))
	// If Start fails, our key goes with the session: Close revokes it, or
	// it ends now if it has not yet. No goroutine per term: the session's
	// timer ends it at its safe-until, and one watch (heldWatch) sees its
	// key deleted.
	t, err := b.sessions.Start(s, sl, name, token, func(ctx context.Context) error { return b.release(ctx, h) }, backend.StartOptions{
		Started: func(t *backend.BasicTerm) { h.term = t },
	})
	if err != nil {
		return nil, err
	}
	b.held.add(h, at)
	b.log.Debug("acquired", "lease", name, "token", token, "rev", rev, "session", fmt.Sprintf("%x", s.ID))
	return &stateTerm{BasicTerm: t, b: b, h: h}, nil
}

// stop stops watching h's key and gives its name back, as when its term
// ends; the term itself goes on.
func (h *held) stop(b *Backend) {
	if b.held.remove(h) {
		b.sessions.Unclaim(h.sl)
	}
}

// release is the term's release function: it deletes h's key if the key is
// still the one this term created.
func (b *Backend) release(ctx context.Context, h *held) error {
	b.held.remove(h)
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
