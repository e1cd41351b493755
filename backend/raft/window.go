package raft

import (
	"time"

	"github.com/batonhq/baton"
)

var _ baton.RenewalWindower = (*Backend)(nil)

// RenewalWindow implements baton.RenewalWindower: TTL less the renew
// interval and drift margin.
func (b *Backend) RenewalWindow() time.Duration {
	return b.cfg.TTL - b.cfg.RenewInterval - b.cfg.DriftMargin
}
