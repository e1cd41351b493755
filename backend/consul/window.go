package consul

import (
	"fmt"
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
	cfg := o.Config
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL > 0 && cfg.RenewInterval == 0 {
		cfg.RenewInterval = defaultRenewInterval(cfg.TTL)
	}
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return 0, err
	}
	sessTTL := (cfg.TTL/2 + time.Millisecond - 1).Truncate(time.Millisecond)
	switch {
	case cfg.DriftMargin >= sessTTL:
		return 0, &baton.ConfigError{Problems: []string{fmt.Sprintf("DriftMargin (%s) must be below TTL/2 (%s), the session TTL asked of Consul", cfg.DriftMargin, sessTTL)}}
	case cfg.RenewInterval >= sessTTL-cfg.DriftMargin:
		return 0, &baton.ConfigError{Problems: []string{fmt.Sprintf("RenewInterval (%s) must be below TTL/2 - DriftMargin (%s) on Consul, the holder's safe window: renew more often or raise TTL",
			cfg.RenewInterval, sessTTL-cfg.DriftMargin)}}
	}
	return sessTTL - cfg.RenewInterval - cfg.DriftMargin, nil
}
