package redis

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton"
	goredis "github.com/redis/go-redis/v9"
)

// URL parameters that ParseURL reads for baton and removes before
// go-redis sees the URL.
const (
	// ParamPrefix is Options.Prefix: ?baton_prefix=myapp:
	ParamPrefix = "baton_prefix"
	// ParamReplicas is Options.Replicas: ?baton_replicas=1. It defaults to
	// 1 on redis+sentinel:// URLs and 0 otherwise.
	ParamReplicas = "baton_replicas"
	// ParamPubSub, set to off, is Options.NoPubSub.
	ParamPubSub = "baton_pubsub"
	// ParamGrant, set to on, is Options.Grant.
	ParamGrant = "baton_grant"
	// ParamPasswordFile names a file whose first line is the password of
	// the URL's user (or of the default user): it keeps the password out
	// of the command line, which every local user can read.
	ParamPasswordFile = "password_file"
	// ParamSentinelPasswordFile names a file whose first line is the
	// sentinels' password (sentinel requirepass), on redis+sentinel:// URLs.
	ParamSentinelPasswordFile = "sentinel_password_file"
)

// URLForms are the URL forms ParseURL reads, for messages.
const URLForms = "redis://[user[:password]@]host[:port][/db][?params], rediss://... (TLS), " +
	"redis+sentinel://[user[:password]@]sentinel[:port][,sentinel[:port]...]/master-name[/db][?params] (rediss+sentinel:// for TLS)"

// URLConfig is what ParseURL reads from a URL.
type URLConfig struct {
	// Client is the client's configuration of a redis:// or rediss:// URL,
	// nil for a Sentinel URL.
	Client *goredis.Options
	// Failover is the client's configuration of a redis+sentinel:// URL,
	// nil otherwise.
	Failover *goredis.FailoverOptions
	// Options holds Prefix, Replicas and NoPubSub from baton's parameters;
	// the caller sets the rest (TTL, Logger, ...).
	Options Options
}

// NewClient returns a client on the URL's server or Sentinel group. The
// caller closes it after the Backend.
func (c URLConfig) NewClient() *goredis.Client {
	if c.Failover != nil {
		return goredis.NewFailoverClient(c.Failover)
	}
	return goredis.NewClient(c.Client)
}

// Addrs returns the addresses the URL names: the server's, or the
// sentinels'.
func (c URLConfig) Addrs() []string {
	if c.Failover != nil {
		return c.Failover.SentinelAddrs
	}
	return []string{c.Client.Addr}
}

// ParseURL reads a redis://, rediss:// or redis+sentinel:// (or
// rediss+sentinel://) URL and baton's own parameters (ParamPrefix,
// ParamReplicas, ParamPubSub, ParamPasswordFile,
// ParamSentinelPasswordFile); the other parameters are go-redis's
// (dial_timeout, read_timeout, pool_size, ...). A Redis Cluster URL
// (redis+cluster://, or several hosts in a redis:// URL) is refused: see
// ErrCluster. Its errors never hold the password, name what is wrong and
// how to fix it, and match *baton.ConfigError.
func ParseURL(raw string) (URLConfig, error) {
	var out URLConfig
	bad := func(format string, args ...any) (URLConfig, error) {
		msg := redactIn(fmt.Sprintf(format, args...), raw)
		return URLConfig{}, &baton.ConfigError{Problems: []string{"redis: " + msg + " (" + URLForms + ")"}}
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return bad("%q is not a URL", "")
	}
	scheme = strings.ToLower(scheme)
	base, query, _ := strings.Cut(rest, "?")
	if strings.Contains(base, "#") || strings.Contains(query, "#") {
		return bad("a fragment (#...) has no meaning here; %%-escape # in a password as %%23")
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return bad("the parameters (after ?) are not valid URL query syntax")
	}
	var passwordFile, sentinelPasswordFile string
	replicasSet := false
	for k, v := range q {
		if len(v) != 1 {
			return bad("parameter %s is given %d times", k, len(v))
		}
		val := v[0]
		switch k {
		case ParamPrefix:
			if val == "" {
				return bad("%s is empty: leave it out for the default %q", k, DefaultPrefix)
			}
			out.Options.Prefix = val
		case ParamReplicas:
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || n > 100 {
				return bad("%s=%s: want the number of replicas that must acknowledge each write, 0 to 100", k, val)
			}
			out.Options.Replicas, replicasSet = n, true
		case ParamPubSub:
			switch val {
			case "off":
				out.Options.NoPubSub = true
			case "on":
			default:
				return bad("%s=%s: want on (the default) or off (waiters poll)", k, val)
			}
		case ParamGrant:
			switch val {
			case "on":
				out.Options.Grant = true
			case "off":
			default:
				return bad("%s=%s: want on (a release grants the lease to the waiting process at the head of the queue) or off (the default: it wakes it)", k, val)
			}
		case ParamPasswordFile:
			passwordFile = val
		case ParamSentinelPasswordFile:
			sentinelPasswordFile = val
		default:
			if strings.HasPrefix(k, "baton") {
				return bad("unknown parameter %q: baton's own parameters are %s, %s, %s", k, ParamPrefix, ParamReplicas, ParamPubSub)
			}
			continue
		}
		delete(q, k)
	}
	readPW := func(param, path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", param, err)
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		pw = strings.TrimRight(pw, "\r")
		if pw == "" {
			return "", fmt.Errorf("%s: %s holds no password on its first line", param, path)
		}
		return pw, nil
	}
	switch scheme {
	case "redis", "rediss":
		if strings.Contains(hostPart(base), ",") {
			return bad("several hosts in one %s:// URL: for Sentinel write redis+sentinel://sentinel1,sentinel2,sentinel3/master-name; Redis Cluster is not supported", scheme)
		}
		if sentinelPasswordFile != "" {
			return bad("%s belongs on a redis+sentinel:// URL", ParamSentinelPasswordFile)
		}
		u := scheme + "://" + base
		if len(q) > 0 {
			u += "?" + q.Encode()
		}
		opt, err := goredis.ParseURL(u)
		if err != nil {
			return bad("%s", strings.TrimPrefix(err.Error(), "redis: "))
		}
		if passwordFile != "" {
			if opt.Password, err = readPW(ParamPasswordFile, passwordFile); err != nil {
				return bad("%v", err)
			}
		}
		opt.ContextTimeoutEnabled = true
		out.Client = opt
		return out, nil
	case "redis+sentinel", "rediss+sentinel":
		fo := &goredis.FailoverOptions{ContextTimeoutEnabled: true}
		if scheme == "rediss+sentinel" {
			fo.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		authority, path, _ := strings.Cut(base, "/")
		auth, hosts := "", authority
		if i := strings.LastIndex(authority, "@"); i >= 0 {
			auth, hosts = authority[:i], authority[i+1:]
		}
		if auth != "" {
			user, pw, hasPW := strings.Cut(auth, ":")
			var err error
			if fo.Username, err = url.PathUnescape(user); err != nil {
				return bad("the user name is not validly %%-escaped")
			}
			if hasPW {
				if fo.Password, err = url.PathUnescape(pw); err != nil {
					return bad("the password is not validly %%-escaped")
				}
			}
		}
		if hosts == "" {
			return bad("no sentinel addresses: write redis+sentinel://host1:26379,host2:26379,host3:26379/master-name")
		}
		for _, h := range strings.Split(hosts, ",") {
			addr, err := withPort(h, "26379")
			if err != nil {
				return bad("sentinel address %q: %v", h, err)
			}
			fo.SentinelAddrs = append(fo.SentinelAddrs, addr)
		}
		master, db, _ := strings.Cut(path, "/")
		if master == "" {
			return bad("no master name: write it after the sentinel addresses, as in redis+sentinel://host:26379/mymaster (the name in `sentinel monitor NAME ...`)")
		}
		var err error
		if fo.MasterName, err = url.PathUnescape(master); err != nil {
			return bad("the master name is not validly %%-escaped")
		}
		if db != "" {
			n, err := strconv.Atoi(db)
			if err != nil || n < 0 {
				return bad("database %q: want a number (0 to 15 on a default server)", db)
			}
			fo.DB = n
		}
		for k, v := range q {
			switch k {
			case "dial_timeout", "read_timeout", "write_timeout":
				d, err := time.ParseDuration(v[0])
				if err != nil || d <= 0 {
					return bad("%s=%s: want a duration such as 2s", k, v[0])
				}
				switch k {
				case "dial_timeout":
					fo.DialTimeout = d
				case "read_timeout":
					fo.ReadTimeout = d
				default:
					fo.WriteTimeout = d
				}
			case "sentinel_username":
				fo.SentinelUsername = v[0]
			default:
				return bad("unknown parameter %q on a Sentinel URL: it takes %s, %s, %s, %s, %s, sentinel_username, dial_timeout, read_timeout, write_timeout",
					k, ParamPrefix, ParamReplicas, ParamPubSub, ParamPasswordFile, ParamSentinelPasswordFile)
			}
		}
		if passwordFile != "" {
			if fo.Password, err = readPW(ParamPasswordFile, passwordFile); err != nil {
				return bad("%v", err)
			}
		}
		if sentinelPasswordFile != "" {
			if fo.SentinelPassword, err = readPW(ParamSentinelPasswordFile, sentinelPasswordFile); err != nil {
				return bad("%v", err)
			}
		}
		if !replicasSet {
			out.Options.Replicas = 1
		}
		out.Failover = fo
		return out, nil
	case "redis+cluster", "rediss+cluster":
		return bad("%v", ErrCluster)
	}
	return bad("scheme %q is not a Redis URL's", scheme)
}

// hostPart returns the host list of a URL's authority and path.
func hostPart(base string) string {
	hp, _, _ := strings.Cut(base, "/")
	if i := strings.LastIndex(hp, "@"); i >= 0 {
		hp = hp[i+1:]
	}
	return hp
}

func withPort(h, port string) (string, error) {
	if h == "" {
		return "", fmt.Errorf("empty")
	}
	if host, p, err := net.SplitHostPort(h); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %q is not a number from 1 to 65535", p)
		}
		if host == "" {
			return "", fmt.Errorf("no host before the port")
		}
		return h, nil
	}
	if strings.ContainsAny(h, ":[]") && !strings.HasPrefix(h, "[") {
		return "", fmt.Errorf("write an IPv6 address in brackets: [::1]:26379")
	}
	return net.JoinHostPort(strings.Trim(h, "[]"), port), nil
}

// redactIn removes the password of raw's userinfo from msg.
func redactIn(msg, raw string) string {
	_, rest, _ := strings.Cut(raw, "://")
	hp, _, _ := strings.Cut(rest, "/")
	i := strings.LastIndex(hp, "@")
	if i < 0 {
		return msg
	}
	_, pw, ok := strings.Cut(hp[:i], ":")
	if !ok || pw == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, pw, "xxxxx")
	if u, err := url.PathUnescape(pw); err == nil && u != "" {
		msg = strings.ReplaceAll(msg, u, "xxxxx")
	}
	return msg
}
