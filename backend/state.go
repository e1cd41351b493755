package backend

import (
	"fmt"

	"github.com/batonhq/baton"
)

// CheckStateSize returns an error wrapping baton.ErrStateTooLarge when value
// is longer than baton.MaxStateSize; backends call it first thing in
// StoreState.
func CheckStateSize(value []byte) error {
	if len(value) > baton.MaxStateSize {
		return fmt.Errorf("%w: %d bytes, at most %d (baton.MaxStateSize)", baton.ErrStateTooLarge, len(value), baton.MaxStateSize)
	}
	return nil
}

// EndedError returns the error StoreState gives for a term that has ended:
// t.Err() when set, or nil while t lasts. Backends call it before touching
// the store, so an ended term never writes.
func EndedError(t baton.Term) error {
	if err := t.Err(); err != nil {
		return fmt.Errorf("baton: the term (token %d) has ended, so it may not store the lease's state: %w", t.Token(), err)
	}
	return nil
}
