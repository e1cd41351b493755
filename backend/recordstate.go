package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton"
)

// term is the Term of a lease this RecordBackend holds: the BasicTerm the renewer
// extends, and the lease's state (baton.StateTerm), kept in LeaseRecord.State.
// Safe for concurrent use.
type recordTerm struct {
	*BasicTerm
	b *RecordBackend
	h *holding
}

var _ baton.StateTerm = (*recordTerm)(nil)

// LoadState implements baton.StateTerm: it reads the record and returns a
// copy of its state. It works after the term ended, and after the RecordBackend
// closed while the RecordStore is usable.
func (t *recordTerm) LoadState(ctx context.Context) ([]byte, error) {
	rec, _, err := t.b.store.Get(ctx, t.h.name)
	if err != nil {
		return nil, t.b.unavailable(ctx, "read the state of lease "+t.h.name, err)
	}
	return bytes.Clone(rec.State), nil
}

// StoreState implements baton.StateTerm. The write is a compare-and-swap
// from the version this term last wrote, so the store refuses it as soon as
// anyone else has written the record: another holder taking it over, or
// anybody rewriting it.
func (t *recordTerm) StoreState(ctx context.Context, value []byte) error {
	if err := CheckStateSize(value); err != nil {
		return err
	}
	if err := EndedError(t); err != nil {
		return err
	}
	return t.b.storeState(ctx, t.h, value)
}

// maxStateTries bounds how many writes of ours StoreState adopts in a row
// before it gives up with ErrBackendUnavailable. With the write lock, only a
// write whose reply was lost can move the version under us, so more than
// one in a row means the store misbehaves.
const maxStateTries = 4

func (b *RecordBackend) storeState(ctx context.Context, h *holding, value []byte) error {
	if err := h.lock(ctx); err != nil {
		return err // nothing was sent
	}
	defer h.unlock()
	// A renewal may have found the record taken while we waited.
	if err := EndedError(h.term); err != nil {
		return err
	}
	state := bytes.Clone(value)
	if state == nil {
		state = []byte{} // stored, if empty: not the same as never stored
	}
	for range maxStateTries {
		rec := h.rec
		rec.State = state
		start := time.Now()
		nv, err := b.store.CompareAndSwap(ctx, h.name, h.version, rec)
		if err == nil {
			h.version, h.rec.State = nv, state
			// The write bumped the version, which makes contenders wait a
			// full TTL from when they see it, like a renewal's: it extends
			// the term as one does.
			h.term.Extend(b.cfg.SafeUntil(start, b.cfg.TTL))
			return nil
		}
		if !errors.Is(err, ErrConflict) {
			return fmt.Errorf("%w: store the state of lease %q (it may or may not have been stored; LoadState tells): %w",
				baton.ErrBackendUnavailable, h.name, err)
		}
		got, gv, gerr := b.store.Get(ctx, h.name)
		if gerr != nil {
			return fmt.Errorf("%w: store the state of lease %q: the record changed, and reading it failed: %w",
				baton.ErrBackendUnavailable, h.name, gerr)
		}
		if got.Holder != h.id || got.Token != h.rec.Token {
			now := fmt.Sprintf("held by %q with token %d", got.Holder, got.Token)
			if got.Holder == "" {
				now = fmt.Sprintf("free (token %d)", got.Token)
			}
			lost := fmt.Errorf("%w: lease %q is now %s, so the store refused the state of token %d",
				baton.ErrLeaseLost, h.name, now, h.rec.Token)
			if h.term.End(lost) {
				b.log.Info("lease lost", "lease", h.name, "token", h.rec.Token, "why", "a state write found the record taken")
			}
			return lost
		}
		// A write of ours whose reply was lost landed: write on top of it.
		b.log.Debug("adopted a write whose reply was lost", "lease", h.name, "token", h.rec.Token)
		h.version, h.rec.State = gv, got.State
	}
	return fmt.Errorf("%w: store the state of lease %q: the record kept changing under this term's writes", baton.ErrBackendUnavailable, h.name)
}
