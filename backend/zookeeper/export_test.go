package zookeeper

import (
	"context"
	"time"

	"github.com/batonhq/baton"
)

// StoreFenced is StoreState without its check that the term is still
// running, so that a test can show the store itself refusing the write of
// a term that has not heard yet of its loss.
func StoreFenced(ctx context.Context, t baton.Term, value []byte) error {
	return t.(*term).store(ctx, value)
}

// RenewalMode returns whether b's live session generation began on a
// standalone server, and the time between its renewals; false when b has
// no live generation.
func RenewalMode(b *Backend) (standalone bool, interval time.Duration, ok bool) {
	s := b.sessions.Live()
	if s == nil {
		return false, 0, false
	}
	return s.ID.standalone, s.ID.interval, true
}
