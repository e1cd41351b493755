package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/go-zookeeper/zk"
	"github.com/hashicorp/consul/api"
)

// The --backend URLs of the ZooKeeper and Consul backends. Both take the
// TLS query parameters of consul.ParseURL, named after the consul CLI's
// flags.

// tlsParams are the query parameters that turn on TLS to a ZooKeeper
// ensemble: ca-file=FILE (the CA that signed the servers' certificates; the
// system's roots when absent), cert-file=FILE and key-file=FILE (a client
// certificate, when the servers ask for one), tls-server-name=NAME (the
// name to verify in the server's certificate, when it is not the host in
// the URL) and tls=1 (TLS with the system's roots and nothing else).
type tlsParams struct {
	enabled                bool
	ca, cert, key, srvName string
}

// parseTLSParams takes the TLS parameters out of q, leaving the rest, and
// reports bad ones the way the URL parsers do.
func parseTLSParams(q url.Values, form string) (tlsParams, error) {
	var p tlsParams
	take := func(name string) (string, error) {
		v := q[name]
		delete(q, name)
		switch {
		case len(v) > 1:
			return "", fmt.Errorf("query parameter %s is given %d times: give it once (%s)", name, len(v), form)
		case len(v) == 1 && v[0] == "":
			return "", fmt.Errorf("query parameter %s is empty: give a file or drop it (%s)", name, form)
		case len(v) == 1:
			return v[0], nil
		}
		return "", nil
	}
	var err error
	var on string
	if on, err = take("tls"); err != nil {
		return p, err
	}
	if on != "" {
		b, perr := strconv.ParseBool(on)
		if perr != nil {
			return p, fmt.Errorf("query parameter tls=%q: use tls=1 or tls=0", on)
		}
		p.enabled = b
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"ca-file", &p.ca}, {"cert-file", &p.cert}, {"key-file", &p.key}, {"tls-server-name", &p.srvName}} {
		if *f.dst, err = take(f.name); err != nil {
			return p, err
		}
		if *f.dst != "" {
			p.enabled = true
		}
	}
	if (p.cert == "") != (p.key == "") {
		return p, fmt.Errorf("cert-file and key-file go together: give both files of the client certificate, or neither (%s)", form)
	}
	return p, nil
}

// config reads the files and returns the TLS configuration, or nil when TLS
// is off. A bad file is a usage error naming it.
func (p tlsParams) config() (*tls.Config, error) {
	if !p.enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: p.srvName}
	if p.ca != "" {
		pem, err := os.ReadFile(p.ca)
		if err != nil {
			return nil, usageErrorf("zk URL ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageErrorf("zk URL ca-file %s holds no PEM certificate: give the CA certificate that signed the servers' certificates", p.ca)
		}
		cfg.RootCAs = pool
	}
	if p.cert != "" {
		pair, err := tls.LoadX509KeyPair(p.cert, p.key)
		if err != nil {
			return nil, usageErrorf("zk URL cert-file %s / key-file %s: %v", p.cert, p.key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// hostPorts checks a comma-separated host[:port] list and fills in the
// default port.
func hostPorts(list, defaultPort, form string) ([]string, error) {
	var out []string
	for _, ep := range strings.Split(list, ",") {
		host, port := ep, defaultPort
		if h, p, err := net.SplitHostPort(ep); err == nil {
			host, port = h, p
		} else if strings.Count(ep, ":") == 1 || strings.HasPrefix(ep, "[") {
			return nil, fmt.Errorf("server %q is not host:port (%v): use %s", ep, err, form)
		}
		if host == "" {
			return nil, fmt.Errorf("server %q has no host: use %s", ep, form)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("server %q: port %q is not a number from 1 to 65535: use %s", ep, port, form)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

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
	return func(ctx context.Context, o backendOptions) (*openBackend, error) {
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
				return &openBackend{Backend: b, close: b.Close}, nil
			}
			var ce *baton.ConfigError
			if errors.As(err, &ce) {
				return nil, usageErrorf("%v", err)
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

// checkZooKeeperLease mirrors the backend's lease-name rule.
func checkZooKeeperLease(name string) error {
	if err := zookeeper.CheckName(name); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "zookeeper: "))
	}
	return nil
}

// parseConsulURL accepts
// consul://host[:port][/prefix][?tls=1&ca-file=F&cert-file=F&key-file=F&tls-server-name=N&token-file=F&dc=DC]
// (consul.ParseURL), the port defaulting to 8500. Lease NAME is held at key
// PREFIX/NAME/.lock (PREFIX defaults to baton), where `consul lock
// PREFIX/NAME` holds it too. The rest comes from Consul's own environment
// variables, as for the consul CLI: CONSUL_HTTP_TOKEN or
// CONSUL_HTTP_TOKEN_FILE (the ACL token), CONSUL_HTTP_SSL, CONSUL_CACERT,
// CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY and CONSUL_TLS_SERVER_NAME; the
// URL's parameters win over them.
func parseConsulURL(u *url.URL) (opener, error) {
	const form = "consul://host:port[/prefix][?ca-file=F&cert-file=F&key-file=F&token-file=F]"
	if u.Host == "" {
		// As for etcd:// and zk://: an empty host would silently mean
		// whatever CONSUL_HTTP_ADDR or the client's default says.
		return nil, fmt.Errorf("no Consul agent: name the local agent, as in consul://127.0.0.1:8500 (%s)", form)
	}
	if u.User != nil {
		// Refused here, where the message can leave the password out.
		return nil, fmt.Errorf("consul URLs take no user:password@: give an ACL token through ?token-file=F or CONSUL_HTTP_TOKEN (%s)", form)
	}
	if _, err := hostPorts(u.Host, "8500", form); err != nil {
		return nil, err
	}
	if strings.Contains(u.Host, ",") {
		return nil, fmt.Errorf("consul URLs name one agent: use the local agent, as in consul://127.0.0.1:8500")
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		u.Host = net.JoinHostPort(u.Host, "8500")
	}
	cc, opts, err := consul.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("%s (%s)", strings.TrimPrefix(err.Error(), "consul: "), form)
	}
	if _, err := opts.Key("x"); err != nil {
		return nil, fmt.Errorf("path %q: %s (%s)", u.Path, strings.TrimPrefix(err.Error(), "consul: "), form)
	}
	return func(ctx context.Context, o backendOptions) (*openBackend, error) {
		for _, f := range []struct{ param, file string }{
			{"ca-file", cc.CAFile}, {"cert-file", cc.CertFile}, {"key-file", cc.KeyFile}, {"token-file", cc.TokenFile},
		} {
			if f.file == "" {
				continue
			}
			if _, err := os.Stat(f.file); err != nil {
				return nil, usageErrorf("consul URL %s: %v", f.param, err)
			}
		}
		client, err := consul.NewClient(cc)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		opts := opts
		opts.Config = backend.Config{TTL: o.TTL}
		opts.Logger = o.Logger
		b, err := consul.New(client, opts)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		return &openBackend{Backend: b, close: b.Close}, nil
	}, nil
}

// consulWindow is the renewal window of a Consul holder at ttl (0: the
// backend's default): its session TTL (TTL/2) less the renew interval and
// drift margin, or why ttl does not work on Consul.
func consulWindow(ttl time.Duration) (time.Duration, error) {
	client, err := api.NewClient(&api.Config{Address: "127.0.0.1:8500"}) // never used: New does not connect
	if err != nil {
		return 0, err
	}
	b, err := consul.New(client, consul.Options{Config: backend.Config{TTL: ttl}})
	if err != nil {
		return 0, err
	}
	defer b.Close(context.Background())
	cfg := b.Config()
	return b.SessionTTL() - cfg.RenewInterval - cfg.DriftMargin, nil
}

// checkConsulLease mirrors the backend's rule: PREFIX/NAME must be a clean
// key path, or `consul lock` would use another key.
func checkConsulLease(name string) error {
	_, err := consul.Options{}.Key(name)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "consul: "))
	}
	return nil
}

// firstKey returns the first of q's keys in sorted order, for a message.
func firstKey(q url.Values) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[0]
}
