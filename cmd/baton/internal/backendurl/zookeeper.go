package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/go-zookeeper/zk"
)

// zkConnectTimeout bounds each attempt to get a ZooKeeper session when the
// CLI starts; `baton run` keeps trying, the short-lived commands give up
// when their --timeout ends.
const zkConnectTimeout = 5 * time.Second

// parseZooKeeperURL accepts
// zk://[user:password@]host[:port][,host[:port]...][/root][?tls params],
// the port defaulting to 2181. Lease NAME is the latch path ROOT/NAME
// (ROOT defaults to /baton), the path a Curator LeaderLatch would be given.
// user:password is ZooKeeper digest authentication; with it, the nodes
// baton creates are writable by that user only and readable by all.
func parseZooKeeperURL(u *url.URL) (opener, error) {
	const form = "zk://[user:password@]host:port[,host:port][/root][?ca-file=F&cert-file=F&key-file=F]"
	if u.Host == "" {
		return nil, fmt.Errorf("no ZooKeeper server: name at least one, as in zk://127.0.0.1:2181/baton")
	}
	servers, err := hostPorts(u.Host, "2181", form)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	tp, err := parseTLSParams(q, form)
	if err != nil {
		return nil, err
	}
	if len(q) > 0 {
		return nil, fmt.Errorf("unknown query parameter %q: zk URLs take tls, ca-file, cert-file, key-file and tls-server-name (%s)", firstKey(q), form)
	}
	root := u.Path
	if root == "" {
		root = zookeeper.DefaultRoot
	} else if root != "/" {
		root = strings.TrimSuffix(root, "/")
	}
	opts := zookeeper.DialOptions{Options: zookeeper.Options{Root: root}}
	if u.User != nil {
		user := u.User.Username()
		pass, ok := u.User.Password()
		if user == "" || !ok {
			return nil, fmt.Errorf("digest credentials must be user:password@ (got %q): use %s", u.User.String(), form)
		}
		opts.Digest = user + ":" + pass
		opts.ACL = append(zk.DigestACL(zk.PermAll, user, pass), zk.WorldACL(zk.PermRead)...)
	}
	// Check the root (and so the options) now: a bad one is a usage error.
	if err := opts.Validate(); err != nil {
		var ce *baton.ConfigError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("path %q: %s (%s)", u.Path, strings.Join(ce.Problems, "; "), form)
		}
		return nil, fmt.Errorf("path %q: %v (%s)", u.Path, err, form)
	}
	return func(ctx context.Context, o Options) (*Backend, error) {
		tlsCfg, err := tp.config()
		if err != nil {
			return nil, err
		}
		opts.TLS = tlsCfg
		opts.Config = backend.Config{TTL: o.TTL}
		opts.Logger = o.Logger
		for attempt := 0; ; attempt++ {
			actx, cancel := context.WithTimeout(ctx, max(zkConnectTimeout, o.TTL))
			b, err := zookeeper.Dial(actx, servers, opts)
			cancel()
			if err == nil {
				return &Backend{Backend: b, close: b.Close}, nil
			}
			var ce *baton.ConfigError
			if errors.As(err, &ce) {
				return nil, settingsErrorf("%v", err)
			}
			if ctx.Err() != nil {
				return nil, err
			}
			if o.Logger != nil {
				o.Logger.Warn("no ZooKeeper session yet; retrying", "servers", strings.Join(servers, ","), "attempt", attempt+1, "err", err)
			}
		}
	}, nil
}

// zooKeeperWindow is the renewal window of a ZooKeeper holder at ttl (0:
// the default), which is shorter than elsewhere (see the zookeeper
// package's ensemble lag).
func zooKeeperWindow(ttl time.Duration) (time.Duration, error) {
	return zookeeper.Options{Config: backend.Config{TTL: ttl}}.RenewalWindow()
}

// zooKeeperLease is the ZooKeeper backend's lease-name rule, in the words
// of a URL user.
func zooKeeperLease(name string) error {
	return trimPrefix(zookeeper.CheckName(name), "zookeeper: ")
}

// trimPrefix drops a backend package's prefix from err's message: in a
// message about a URL, the scheme already says which backend.
func trimPrefix(err error, prefix string) error {
	if err == nil {
		return nil
	}
	return errors.New(strings.TrimPrefix(err.Error(), prefix))
}
