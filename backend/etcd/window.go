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

// RenewalWindow returns how far ahead safe-until stays, at worst, while
// renewals are healthy, for a Backend made by New with these options, or
// the error New would give for their timing. It must apply New's defaults.
func (o Options) RenewalWindow() (time.Duration, error) {
	cfg, err := o.config()
	if err != nil {
		return 0, err
	}
	return cfg.TTL - cfg.RenewInterval - cfg.DriftMargin, nil
}
