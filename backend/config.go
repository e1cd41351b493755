package backend

import (
	"fmt"
	"time"

	"github.com/batonhq/baton"
)

// Defaults applied by Config.WithDefaults when a field is zero.
const (
	// DefaultTTL is the lease time-to-live when Config.TTL is zero.
	DefaultTTL = 10 * time.Second
)

// Config holds the timing every backend shares. Its zero value means the
// documented defaults; backends embed it in their own options. A Config is a
// plain value and safe to copy.
type Config struct {
	// TTL is how long a lease survives without a confirmed renewal. A contender
	// takes over only after it has seen the lease unrenewed for a full TTL on its
	// own monotonic clock (or the server reports the session dead). Larger TTLs
	// ride out longer backend hiccups; smaller ones fail over faster.
	// Zero means DefaultTTL (10 s); a backend may set its own default (see
	// its Options). Must not be negative.
	TTL time.Duration

	// RenewInterval is how often the holder renews. Zero means TTL/3, which
	// leaves two more attempts before the lease is in danger; a backend may
	// set its own default (etcd TTL/2, Consul TTL/4, ZooKeeper TTL/6). It must be
	// positive and below TTL - DriftMargin, or no renewal could ever keep the
	// lease safe.
	RenewInterval time.Duration

	// DriftMargin is subtracted from every safe-until deadline to absorb the
	// difference in clock *rate* between the holder and the server or the
	// contenders (wall-clock offsets do not matter: baton only compares
	// monotonic durations). Zero means TTL/10 with a floor of 10 ms. It must be
	// below TTL.
	DriftMargin time.Duration
}

// WithDefaults returns c with every zero field replaced by its default, or a
// *baton.ConfigError naming every invalid field.
func (c Config) WithDefaults() (Config, error) {
	var errs problems
	if c.TTL < 0 {
		errs.add(fmt.Sprintf("TTL (%s) must be positive: use a duration such as 10s", c.TTL))
	}
	if c.RenewInterval < 0 {
		errs.add(fmt.Sprintf("RenewInterval (%s) must be positive, or zero for TTL/3", c.RenewInterval))
	}
	if c.DriftMargin < 0 {
		errs.add(fmt.Sprintf("DriftMargin (%s) must be positive, or zero for TTL/10", c.DriftMargin))
	}
	if err := errs.errOrNil(); err != nil {
		return c, err
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.DriftMargin == 0 {
		c.DriftMargin = max(c.TTL/10, 10*time.Millisecond)
	}
	if c.DriftMargin >= c.TTL {
		errs.add(fmt.Sprintf("DriftMargin (%s) must be below TTL (%s)", c.DriftMargin, c.TTL))
	} else if c.RenewInterval >= c.TTL-c.DriftMargin {
		errs.add(fmt.Sprintf("RenewInterval (%s) must be below TTL - DriftMargin (%s): renew more often or raise TTL",
			c.RenewInterval, c.TTL-c.DriftMargin))
	}
	return c, errs.errOrNil()
}

// SafeUntil returns the deadline by which a holder must stop acting when its
// last confirmed renewal (or acquisition) was *sent* at start and the lease
// lasts ttl from when the server applied it. start must carry a monotonic
// reading (come from time.Now), so the deadline survives wall-clock jumps.
//
// A ttl above c.TTL counts as c.TTL: the ttl usually comes from the
// server's reply, and a client believes no server about time, so no reply
// (a server granting more than asked, or an impostor answering ten hours)
// moves the deadline past the client's own TTL from its own send time.
// A shorter ttl shortens it.
func (c Config) SafeUntil(start time.Time, ttl time.Duration) time.Time {
	if c.TTL > 0 {
		ttl = min(ttl, c.TTL)
	}
	return start.Add(ttl - c.DriftMargin)
}

// CapSafeUntil returns until, or the latest deadline a renewal sent at
// sent may give (sent + TTL - DriftMargin) if until is later: the bound
// that SessionManager applies to every safe-until a backend's driver
// reports, whatever the driver computed from the server's reply. A zero
// TTL leaves until as it is.
func (c Config) CapSafeUntil(sent, until time.Time) time.Time {
	if c.TTL <= 0 {
		return until
	}
	if limit := sent.Add(c.TTL - c.DriftMargin); until.After(limit) {
		return limit
	}
	return until
}

// problems collects the findings of a validation; errOrNil returns them as one
// *baton.ConfigError, or nil when there are none.
type problems []string

func (p *problems) add(s string) { *p = append(*p, s) }

func (p problems) errOrNil() error {
	if len(p) == 0 {
		return nil
	}
	return &baton.ConfigError{Problems: p}
}
