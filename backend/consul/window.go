package consul

import (
	"time"

	"github.com/batonhq/baton"
)

var _ baton.RenewalWindower = (*Backend)(nil)

// RenewalWindow implements baton.RenewalWindower: the session TTL (TTL/2)
// less the renew interval and drift margin.
func (b *Backend) RenewalWindow() time.Duration {
	return b.sessTTL - b.cfg.RenewInterval - b.cfg.DriftMargin
}

// RenewalWindow returns how far ahead safe-until stays, at worst, while
// renewals are healthy, for a Backend with these options: the session TTL
// (TTL/2) less the renew interval and drift margin. It returns the error
// New would give for a timing New refuses.
func (o Options) RenewalWindow() (time.Duration, error) {
	cfg, sessTTL, problems, err := o.timing()
	if err != nil {
		return 0, err
	}
	if len(problems) > 0 {
		return 0, &baton.ConfigError{Problems: problems}
	}
	return sessTTL - cfg.RenewInterval - cfg.DriftMargin, nil
}
