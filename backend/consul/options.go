package consul

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

// Defaults applied by New when an Options field is zero.
const (
	// DefaultTTL is the TTL when Options.TTL is zero: twice Consul's
	// default session_ttl_min (10 s), because the session TTL baton asks
	// Consul for is TTL/2 (see the package doc).
	DefaultTTL = 20 * time.Second

	// DefaultPrefix is the key prefix when Options.Prefix is empty.
	DefaultPrefix = "baton/"

	// DefaultSessionName is the session name when Options.SessionName is
	// empty.
	DefaultSessionName = "baton"

	// DefaultMaxRequests is MaxRequests when Options.MaxRequests is zero.
	// With the watch's blocking queries (at most 16) a Backend then keeps
	// at most 80 connections to its agent, well under the agent's default
	// limit of 200 per client address (limits.http_max_conns_per_client),
	// past which the agent answers 429.
	DefaultMaxRequests = 64

	// MaxLockDelay is the longest lock-delay Consul applies (structs.MaxLockDelay);
	// it silently caps longer ones, so New refuses them.
	MaxLockDelay = 60 * time.Second

	// lockKey is the key below a lease's prefix, as `consul lock` names it
	// (api.DefaultSemaphoreKey).
	lockKey = ".lock"

	// watchWait is the wait time of the Backend's blocking query. An idle
	// watch re-reads its keys this often; a change wakes it at once.
	watchWait = time.Minute

	// maxWatchQueries bounds the blocking queries a Backend keeps open (see
	// watcher), each holding a connection to the agent: well under the
	// agent's default limit of 200 per client address
	// (limits.http_max_conns_per_client), which the Backend's other
	// requests and other clients on the host share.
	maxWatchQueries = 16
	// watchSplitAt is the number of keys in one answer above which the
	// watcher splits a group of keys (see watcher): reading a few hundred
	// keys costs about what a request itself costs (the round trip, the agent's work).
	watchSplitAt = 1024
	// watchQuiet is how long a group too big to stay whole must have seen
	// no change for its next change to split it.
	watchQuiet = time.Second
	// watchStormLeases is how many leases with a key changed since a big
	// group's last answer make a storm, which the group is read at a pace
	// through (see watcher.run): a hand-over changes the keys of one lease
	// (its lock, its epoch, a queue entry), and many processes campaigning
	// at once change many leases' keys between two answers.
	watchStormLeases = 2
)

// Options configures a Backend. The zero value means the documented
// defaults. Options is a plain value and safe to copy.
type Options struct {
	backend.
		// Config holds TTL, RenewInterval and DriftMargin. On Consul, zero
		// values mean: TTL DefaultTTL (20 s); RenewInterval TTL/4 (half the
		// session TTL, TTL/2, as api.Session.RenewPeriodic and `consul lock`
		// renew; a renewal that fails is retried four times as often);
		// DriftMargin TTL/10. RenewInterval must be below TTL/2 − DriftMargin,
		// the holder's safe window (see the package doc).
		Config

	// Prefix goes in front of every lease name: lease NAME is held at key
	// Prefix + NAME + "/.lock", exactly the key of `consul lock
	// Prefix+NAME`, so that the two exclude each other. Empty means
	// DefaultPrefix ("baton/"). It must not begin with "/", and Prefix+NAME
	// must be a clean path (no "//", "." or ".." segments, no trailing "/"),
	// or the CLI would compute a different key. The ACL token needs
	// key:write on it.
	Prefix string

	// LockDelay is the session's lock-delay: after Consul invalidates the
	// session (its TTL ran out, a health check failed, or someone destroyed
	// it), the keys it held cannot be locked again for this long. Zero
	// means TTL/6 without Checks, and the session TTL (TTL/2) with
	// Checks; with Checks it must be at least the session TTL. It must not
	// exceed MaxLockDelay (60 s). Explicit releases (Resign, Close) are
	// not delayed. See the package doc for the trade-off against Consul's
	// own default of 15 s.
	LockDelay time.Duration

	// Checks are node health check IDs (such as "serfHealth", Consul's
	// default) that Consul ties to the session: when one fails, Consul
	// invalidates the session at once and every lease riding on it is
	// lost. Empty (the default) means none: the session lives by its TTL
	// alone, renewed by this process, which is the better signal of this
	// process being alive than its node's health.
	Checks []string

	// ServiceChecks are service health checks tied to the session, as
	// Checks.
	ServiceChecks []api.ServiceCheck

	// SessionName names the session, as /v1/session/list and the UI show
	// it. Empty means DefaultSessionName ("baton").
	SessionName string

	// MaxRequests bounds the requests the Backend has in flight to the
	// agent at once, besides its blocking queries and its session's own
	// (create, renew, destroy): a campaign's read or transaction waits for
	// a turn, within its request timeout. Each request in flight holds a
	// connection, and the agent refuses a client address more than
	// limits.http_max_conns_per_client (200 by default) with 429, so a
	// process starting thousands of campaigns at once must not send them
	// all at once. Zero means DefaultMaxRequests (64); it must not be
	// negative. Raise it only with the agent's limit.
	MaxRequests int

	// Logger receives log lines (group "consul"). Nil (the default) means
	// silent.
	Logger *slog.Logger
}

// Key returns the key at which a Backend with these options holds lease
// name, Prefix + name + "/.lock" (Prefix defaulting to DefaultPrefix), or
// an error if the name or the prefix cannot make a key that `consul lock`
// would use as it is. It needs no client, so that a program can check a
// lease name before it connects.
func (o Options) Key(name string) (string, error) {
	prefix := o.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if name == "" {
		return "", errors.New("consul: lease name must not be empty")
	}
	if !cleanPath(prefix + "x") {
		return "", fmt.Errorf("consul: Prefix %q must be a clean relative path prefix (no leading \"/\", no \"//\", \".\" or \"..\" segments)", prefix)
	}
	if !cleanPath(prefix + name) {
		return "", fmt.Errorf("consul: lease name %q must be a clean path (no leading or trailing \"/\", no \"//\", \".\" or \"..\" segments): "+
			"`consul lock` would clean %q to another key", name, prefix+name)
	}
	return prefix + name + "/" + lockKey, nil
}

// cleanPath reports whether p is a relative path that `consul lock` uses
// as it is: path.Join(p, ".lock") == p + "/.lock", and no "." or ".."
// segments that an HTTP client or server might resolve.
func cleanPath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || path.Join(p, lockKey) != p+"/"+lockKey {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// MaxSessionTTL is the longest session TTL Consul servers accept (their
// limit is fixed; the shortest, session_ttl_min, is configured, 10 s by
// default). A Backend asks for TTL/2, so New refuses a TTL above twice
// this.
const MaxSessionTTL = 24 * time.Hour

// timing fills in o's timing defaults and returns them with the session TTL
// (TTL/2) asked of Consul and every problem found in them; err is an error
// that is not a problem with o.
func (o Options) timing() (cfg backend.Config, sessTTL time.Duration, problems []string, err error) {
	cfg = o.Config
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL > 0 && cfg.RenewInterval == 0 {
		cfg.RenewInterval = defaultRenewInterval(cfg.TTL)
	}
	cfg, err = cfg.WithDefaults()
	var ce *baton.ConfigError
	if errors.As(err, &ce) {
		problems = append(problems, ce.Problems...)
	} else if err != nil {
		return cfg, 0, nil, err
	}
	sessTTL = (cfg.TTL/2 + time.Millisecond - 1).Truncate(time.Millisecond)
	if err == nil {
		switch {
		case sessTTL > MaxSessionTTL:
			problems = append(problems, fmt.Sprintf("TTL (%s) asks Consul for a session TTL (TTL/2) of %s, above %s, the longest Consul servers accept: use a TTL of at most %s",
				cfg.TTL, sessTTL, MaxSessionTTL, 2*MaxSessionTTL))
		case cfg.DriftMargin >= sessTTL:
			problems = append(problems, fmt.Sprintf("DriftMargin (%s) must be below TTL/2 (%s), the session TTL asked of Consul", cfg.DriftMargin, sessTTL))
		case cfg.RenewInterval >= sessTTL-cfg.DriftMargin:
			problems = append(problems, fmt.Sprintf("RenewInterval (%s) must be below TTL/2 - DriftMargin (%s) on Consul, the holder's safe window: renew more often or raise TTL",
				cfg.RenewInterval, sessTTL-cfg.DriftMargin))
		}
	}
	return cfg, sessTTL, problems, nil
}

// settle fills in o's defaults and returns the timing, the session TTL
// (TTL/2), the lock-delay and the key prefix, with every problem found in
// o; err is an error that is not a problem with o.
func (o Options) settle() (cfg backend.Config, sessTTL, lockDelay time.Duration, prefix string, problems []string, err error) {
	cfg, sessTTL, problems, err = o.timing()
	if err != nil {
		return cfg, 0, 0, "", nil, err
	}
	lockDelay, problems = o.lockDelay(cfg, sessTTL, problems)
	if o.MaxRequests < 0 {
		problems = append(problems, fmt.Sprintf("MaxRequests (%d) must not be negative; zero means %d", o.MaxRequests, DefaultMaxRequests))
	}
	prefix = o.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.HasPrefix(prefix, "/") {
		problems = append(problems, fmt.Sprintf("Prefix %q must not begin with \"/\": `consul lock` strips it, so the two would use different keys", prefix))
	} else if !cleanPath(prefix + "x") {
		problems = append(problems, fmt.Sprintf("Prefix %q must be a clean path prefix (no \"//\", \".\" or \"..\" segments): `consul lock` would clean it and use another key", prefix))
	}
	return cfg, sessTTL, lockDelay, prefix, problems, nil
}

// defaultRenewInterval is RenewInterval when Options.Config leaves it
// zero: half the session TTL (TTL/2).
func defaultRenewInterval(ttl time.Duration) time.Duration { return ttl / 4 }

// lockDelay returns the session lock-delay o asks for, defaults filled in,
// with problems and those it finds.
func (o Options) lockDelay(cfg backend.Config, sessTTL time.Duration, problems []string) (time.Duration, []string) {
	checks := len(o.Checks) > 0 || len(o.ServiceChecks) > 0
	lockDelay := o.LockDelay
	switch {
	case lockDelay < 0:
		problems = append(problems, fmt.Sprintf("LockDelay (%s) must not be negative", lockDelay))
	case lockDelay > MaxLockDelay:
		problems = append(problems, fmt.Sprintf("LockDelay (%s) must not exceed %s, the most Consul applies", lockDelay, MaxLockDelay))
	case lockDelay == 0 && checks:
		lockDelay = sessTTL
	case lockDelay == 0:
		lockDelay = cfg.TTL / 6
	case checks && lockDelay < sessTTL:
		problems = append(problems, fmt.Sprintf("LockDelay (%s) must be at least the session TTL (%s, TTL/2) when Checks are set: "+
			"a failing check invalidates the session while its holder may still act until its safe-until", lockDelay, sessTTL))
	}
	return lockDelay, problems
}
