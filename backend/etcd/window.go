package etcd

import (
	"time"

	"github.com/batonhq/baton"
)

// CheckName returns why a Backend cannot take lease name, or nil: names
// must not be empty or contain "/".
func CheckName(name string) error { return checkName(name) }

var _ baton.RenewalWindower = (*Backend)(nil)

// RenewalWindow implements baton.RenewalWindower: TTL less the renew
// interval and drift margin.
func (b *Backend) RenewalWindow() time.Duration {
	return b.cfg.TTL - b.cfg.RenewInterval - b.cfg.DriftMargin
}
