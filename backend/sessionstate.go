package backend

import (
	"context"

	"github.com/batonhq/baton"
)

// StoreState is a session backend's StateTerm.StoreState for term t: it
// refuses a value over the size limit, and a term that has ended, and
// otherwise leaves the fenced write to store, which the server decides.
func StoreState(ctx context.Context, t baton.Term, value []byte, store func(context.Context, []byte) error) error {
	if err := CheckStateSize(value); err != nil {
		return err
	}
	if err := EndedError(t); err != nil {
		return err
	}
	return store(ctx, value)
}
