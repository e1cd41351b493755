package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdDialTimeout bounds etcd's authentication round trip (and, plus a
// second, its lease keep-alive requests); connecting itself is lazy, and
// opening the client is also bounded by Open's context.
const etcdDialTimeout = 5 * time.Second

// parseEtcdURL accepts etcd://[user[:password]@]host[:port][,host[:port]...]
// with the port defaulting to 2379.
func parseEtcdURL(u *url.URL) (opener, error) {
	const form = "etcd://host:port[,host:port]"
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("etcd URLs take no path (got %q): use %s", u.Path, form)
	}
	if u.RawQuery != "" {
		return nil, fmt.Errorf("etcd URLs take no query parameters (got %q): use %s", u.RawQuery, form)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("no etcd endpoint: name at least one, as in etcd://127.0.0.1:2379")
	}
	var endpoints []string
	for _, ep := range strings.Split(u.Host, ",") {
		host, port := ep, "2379"
		if h, p, err := net.SplitHostPort(ep); err == nil {
			host, port = h, p
		} else if strings.Count(ep, ":") == 1 || strings.HasPrefix(ep, "[") {
			return nil, fmt.Errorf("endpoint %q is not host:port (%v): use %s", ep, err, form)
		}
		if host == "" {
			return nil, fmt.Errorf("endpoint %q has no host: use %s", ep, form)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("endpoint %q: port %q is not a number from 1 to 65535: use %s", ep, port, form)
		}
		endpoints = append(endpoints, net.JoinHostPort(host, port))
	}
	var username, password string
	if u.User != nil {
		username = u.User.Username()
		password, _ = u.User.Password()
	}
	return func(ctx context.Context, o Options) (*Backend, error) {
		// The client lives past ctx (which bounds only opening it), but
		// clientv3.New authenticates user:password@ before it returns,
		// for up to DialTimeout: cancel the client's own context if ctx
		// ends first, so that --timeout and a signal are honoured.
		cctx, ccancel := context.WithCancel(context.WithoutCancel(ctx))
		stop := context.AfterFunc(ctx, ccancel)
		client, err := clientv3.New(clientv3.Config{
			Endpoints:   endpoints,
			DialTimeout: etcdDialTimeout,
			Username:    username,
			Password:    password,
			Context:     cctx,
			// The client logs every reconnection attempt at length; the
			// backend reports what matters through our logger.
			Logger: zap.NewNop(),
		})
		if !stop() {
			if err == nil {
				_ = client.Close()
			}
			ccancel()
			return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(endpoints, ","), context.Cause(ctx))
		}
		if err != nil {
			ccancel()
			if errors.Is(err, rpctypes.ErrAuthFailed) {
				return nil, settingsErrorf("etcd %s refused user %q: %v; check user:password@ in the URL", strings.Join(endpoints, ","), username, err)
			}
			return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(endpoints, ","), err)
		}
		b, err := etcd.New(client, etcd.Options{
			Config: backend.Config{TTL: o.TTL},
			Logger: o.Logger,
		})
		if err != nil {
			_ = client.Close()
			ccancel()
			return nil, err
		}
		return &Backend{Backend: b, close: func(ctx context.Context) error {
			// The backend does not own the client (it was handed in), so
			// close both: the backend first, to revoke its session.
			defer ccancel()
			return errors.Join(b.Close(ctx), client.Close())
		}}, nil
	}, nil
}

// etcdLease is the etcd backend's lease-name rule, in the words of a URL
// user.
func etcdLease(name string) error {
	return trimPrefix(etcd.CheckName(name), "etcd: ")
}

// etcdWindow is the renewal window of an etcd holder at ttl (0: the
// backend's default).
func etcdWindow(ttl time.Duration) (time.Duration, error) {
	return etcd.Options{Config: backend.Config{TTL: ttl}}.RenewalWindow()
}
