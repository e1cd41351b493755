package zookeeper

import (
	"time"

	"github.com/batonhq/baton"
)

var _ baton.RenewalWindower = (*Backend)(nil)

// RenewalWindow implements baton.RenewalWindower: as
// Options.RenewalWindow, if the server granted the TTL asked for.
func (b *Backend) RenewalWindow() time.Duration {
	return safeWindow(b.cfg, b.cfg.TTL)
}
