package consul

import (
	"context"

	"github.com/batonhq/baton"
)

// StoreFenced is StoreState without its check that the term is still
// running, so that a test can show the store itself refusing the write of
// a term that has not heard yet of its loss.
func StoreFenced(ctx context.Context, t baton.Term, value []byte) error {
	return t.(*term).store(ctx, value)
}
