package backendurl

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
)

// parseConsulURL accepts
// consul://host[:port][/prefix][?tls=1&ca-file=F&cert-file=F&key-file=F&tls-server-name=N&token-file=F&dc=DC&compress=true]
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
	return func(ctx context.Context, o Options) (*Backend, error) {
		for _, f := range []struct{ param, file string }{
			{"ca-file", cc.CAFile}, {"cert-file", cc.CertFile}, {"key-file", cc.KeyFile}, {"token-file", cc.TokenFile},
		} {
			if f.file == "" {
				continue
			}
			if _, err := os.Stat(f.file); err != nil {
				return nil, settingsErrorf("consul URL %s: %v", f.param, err)
			}
		}
		client, err := consul.NewClient(cc)
		if err != nil {
			return nil, settingsErrorf("%v", err)
		}
		opts := opts
		opts.Config = backend.Config{TTL: o.TTL}
		opts.Logger = o.Logger
		b, err := consul.New(client, opts)
		if err != nil {
			return nil, settingsErrorf("%v", err)
		}
		return &Backend{Backend: b, close: b.Close}, nil
	}, nil
}

// consulWindow is the renewal window of a Consul holder at ttl (0: the
// backend's default): its session TTL (TTL/2) less the renew interval and
// drift margin, or why ttl does not work on Consul.
func consulWindow(ttl time.Duration) (time.Duration, error) {
	return consul.Options{Config: backend.Config{TTL: ttl}}.RenewalWindow()
}

// consulLease is the Consul backend's lease-name rule at the default
// prefix, in the words of a URL user: PREFIX/NAME must be a clean key
// path, or `consul lock` would use another key.
func consulLease(name string) error {
	_, err := consul.Options{}.Key(name)
	return trimPrefix(err, "consul: ")
}
