package etcd

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// Options configures a Backend. The zero value means the documented defaults.
type Options struct {
	// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s, TTL/2,
	// TTL/10). etcd grants TTLs in whole seconds, so TTL is rounded up to the
	// next second when the session is granted; RenewInterval and DriftMargin
	// are used as given. A renewal that fails is retried four times as
	// often, so renewing at TTL/2, about as etcd's own keep-alive loop
	// does, still leaves time for the retries a failing renewal needs.
	backend.Config

	// Prefix is put in front of every lease name to make the etcd election
	// name, as in concurrency.NewElection(session, Prefix+name); include a
	// trailing "/" if you want one. Empty (the default) means the lease name
	// is the election name, so that `etcdctl elect --listen NAME` finds it;
	// set it (say to "baton/") to keep baton's keys apart in a shared etcd.
	Prefix string

	// Logger receives log lines (group "etcd"). Nil (the default) means
	// silent.
	Logger *slog.Logger
}

// MaxTTL is the longest lease TTL etcd grants: its servers refuse a longer
// one ("etcdserver: too large lease TTL"; lease.MaxLeaseTTL in etcd's
// server, 9,000,000,000 s, about 285 years). New refuses a longer TTL.
const MaxTTL = 9_000_000_000 * time.Second

// config returns o's timing with the defaults filled in: backend.Config's,
// except RenewInterval, TTL/2 by default (see Options.Config).
func (o Options) config() (backend.Config, error) {
	c := o.Config
	if c.TTL > MaxTTL {
		// Checked first: the defaults below and the rounding up to
		// whole seconds would overflow near the largest Duration.
		return c, &baton.ConfigError{Problems: []string{fmt.Sprintf(
			"etcd: TTL (%s) is above etcd's maximum lease TTL, %s (%d s): etcd servers refuse longer leases; use a TTL of at most that",
			c.TTL, MaxTTL, int64(MaxTTL/time.Second))}}
	}
	if c.TTL == 0 {
		c.TTL = backend.DefaultTTL
	}
	if c.TTL > 0 && c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 2
	}
	return c.WithDefaults()
}

func checkName(name string) error {
	if name == "" {
		return errors.New("etcd: lease name must not be empty")
	}
	if strings.Contains(name, "/") {
		return fmt.Errorf("etcd: lease name %q must not contain \"/\": its keys would fall under election %q too, and the two would contend; put shared path segments in Options.Prefix",
			name, name[:strings.IndexByte(name, '/')])
	}
	return nil
}
