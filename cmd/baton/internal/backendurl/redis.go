package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
)

// RedisForm shows how Redis URLs are written, for messages.
const RedisForm = "redis://[user[:password]@]host[:port][/db][?params] (rediss:// for TLS; redis+sentinel://[user[:password]@]s1[:26379],s2,s3/MASTER[/db] for Sentinel)"

// redisRetry is the pause between attempts to reach the server when
// opening.
const redisRetry = time.Second

// parseRedisURL accepts the URLs redis.ParseURL reads: redis://,
// rediss://, redis+sentinel:// and rediss+sentinel://, with baton's
// parameters (baton_prefix, baton_replicas, baton_pubsub, password_file,
// sentinel_password_file). Redis Cluster is refused. It does not connect.
func parseRedisURL(raw string) (opener, []string, error) {
	cfg, err := redis.ParseURL(raw)
	if err != nil {
		var ce *baton.ConfigError
		if errors.As(err, &ce) {
			return nil, nil, errors.New(strings.Join(ce.Problems, "; "))
		}
		return nil, nil, err
	}
	var hosts []string
	for _, a := range cfg.Addrs() {
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil, nil, fmt.Errorf("redis: address %q: %v (%s)", a, err, RedisForm)
		}
		if err := CheckHost(h); err != nil {
			return nil, nil, fmt.Errorf("redis: server %q: %v: use %s", h, err, RedisForm)
		}
		hosts = append(hosts, h)
	}
	return func(ctx context.Context, o Options) (*Backend, error) {
		return openRedis(ctx, cfg, o)
	}, hosts, nil
}

// openRedis opens a client and the backend on it, retrying while the
// server cannot be reached; a refusal that retrying cannot fix (a wrong
// password, a missing permission, Redis Cluster) is a *SettingsError.
func openRedis(ctx context.Context, cfg redis.URLConfig, o Options) (*Backend, error) {
	client := cfg.NewClient()
	opts := cfg.Options
	opts.Config = backend.Config{TTL: o.TTL}
	opts.Logger = o.Logger
	for attempt := 1; ; attempt++ {
		b, err := redis.New(ctx, client, opts)
		if err == nil {
			return &Backend{Backend: b, close: func(ctx context.Context) error {
				defer client.Close()
				return b.Close(ctx)
			}}, nil
		}
		var ce *baton.ConfigError
		if errors.As(err, &ce) {
			_ = client.Close()
			return nil, settingsErrorf("%v", err)
		}
		if msg := err.Error(); strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "NOPERM") {
			_ = client.Close()
			return nil, settingsErrorf("%v: check the URL's user and password (or password_file)", err)
		}
		if ctx.Err() != nil {
			_ = client.Close()
			return nil, err
		}
		if o.Logger != nil {
			o.Logger.Warn("redis not reachable yet; retrying", "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			_ = client.Close()
			return nil, err
		case <-time.After(redisRetry):
		}
	}
}
