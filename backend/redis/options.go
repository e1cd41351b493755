package redis

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// DefaultPrefix is the default Options.Prefix.
const DefaultPrefix = "baton:"

// Options configures a Backend. The zero value means the documented
// defaults.
type Options struct {
	// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s,
	// TTL/3, TTL/10). Each lease key expires a TTL after its last renewal;
	// the process renews all its keys in one script call every
	// RenewInterval.
	backend.Config

	// Prefix starts every key and the channel baton uses (see the package
	// documentation, "Keys"). Empty means DefaultPrefix ("baton:"). A
	// redsync mutex shares lease NAME when it is named Prefix+"lease:"+NAME.
	Prefix string

	// Replicas is how many replicas must acknowledge (WAIT) an acquisition
	// or a renewal before it counts: a write the replicas did not receive
	// is lost when Sentinel promotes one of them, so a term must not rest
	// on it. Zero (the default) waits for none, which is right for a
	// server without replicas; with Sentinel, set it to 1 or more (the
	// CLI's redis+sentinel:// URLs default to 1). See
	// docs/backends/redis.md.
	Replicas int

	// ReplicaTimeout bounds each WAIT. Zero means RenewInterval/3.
	ReplicaTimeout time.Duration

	// PollInterval is how often a waiting candidate reads its lease besides
	// the wake-ups by pub/sub (which a redsync release, a key's expiry or a
	// lost message does not send). Zero means RenewInterval. A waiter also
	// reads the lease when its key's remaining time to live runs out.
	PollInterval time.Duration

	// NoPubSub turns the pub/sub wake-ups off: waiters poll.
	NoPubSub bool

	// Grant makes this process ask, while it waits for a lease, that a
	// release grant the lease to it directly when it heads the queue: it
	// then holds the lease as it hears of it, with no acquisition of its
	// own (one round trip fewer per hand-over). The cost: a granted key
	// lives nearly a TTL before its holder renews it, so a head that is
	// still connected but stopped (SIGSTOP, hung, partitioned unnoticed)
	// holds the lease up to a TTL, where a woken head is passed over after
	// a tenth of the TTL (at most a second). Ignored with Replicas above 0
	// or NoPubSub. Default false. See docs/backends/redis.md.
	Grant bool

	// Logger receives log lines (group "redis"). Nil means silent.
	Logger *slog.Logger
}

// options are Options with the defaults filled in.
type options struct {
	Options
	cfg  backend.Config
	poll time.Duration
	wait time.Duration
	log  *slog.Logger
}

func (o Options) withDefaults() (options, error) {
	var problems []string
	cfg, err := o.Config.WithDefaults()
	if err != nil {
		if ce, ok := err.(*baton.ConfigError); ok {
			problems = append(problems, ce.Problems...)
		} else {
			problems = append(problems, err.Error())
		}
	}
	if o.PollInterval < 0 {
		problems = append(problems, fmt.Sprintf("PollInterval (%s) must be positive, or zero for RenewInterval", o.PollInterval))
	}
	if o.Replicas < 0 {
		problems = append(problems, fmt.Sprintf("Replicas (%d) must be zero or more", o.Replicas))
	}
	if o.ReplicaTimeout < 0 {
		problems = append(problems, fmt.Sprintf("ReplicaTimeout (%s) must be positive, or zero for RenewInterval/3", o.ReplicaTimeout))
	} else if err == nil && o.ReplicaTimeout >= cfg.RenewInterval {
		problems = append(problems, fmt.Sprintf("ReplicaTimeout (%s) must be shorter than RenewInterval (%s): a renewal waits that long for the replicas", o.ReplicaTimeout, cfg.RenewInterval))
	}
	if len(problems) > 0 {
		return options{}, &baton.ConfigError{Problems: problems}
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	poll := o.PollInterval
	if poll == 0 {
		poll = cfg.RenewInterval
	}
	wait := o.ReplicaTimeout
	if wait == 0 {
		wait = cfg.RenewInterval / 3
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return options{Options: o, cfg: cfg, poll: poll, wait: wait, log: log.WithGroup("redis")}, nil
}
