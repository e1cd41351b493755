package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/backend/raft"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// backendSchemes is the one place that maps a --backend URL scheme to a
// backend. The library never does this (backends take typed values); only
// the CLI needs names, and an explicit table keeps the set visible.
var backendSchemes = map[string]backendScheme{
	"etcd":   {form: "etcd://host:port[,host:port]", parse: parseEtcdURL, checkLease: checkEtcdLease},
	"memory": {form: "memory://", parse: parseMemoryURL},
	"raft":   {form: "raft:// (with --bind, --join, --tls-*, BATON_SECRET)", parse: parseRaftURL, window: raftWindow},
	"agent":  {form: "agent://host:port", parse: parseAgentURL, window: raftWindow},
	"zk":     {form: "zk://host:port[,host:port][/root]", parse: parseZooKeeperURL, checkLease: checkZooKeeperLease, window: zooKeeperWindow},
	"consul": {form: "consul://host:port[/prefix]", parse: parseConsulURL, checkLease: checkConsulLease, window: consulWindow},
}

type backendScheme struct {
	form  string                         // the URL form, for messages and help
	parse func(*url.URL) (opener, error) // checks the URL without connecting
	// checkLease rejects lease names the backend cannot take, so that the
	// mistake is a usage error rather than a campaign retried forever. Nil
	// accepts any non-empty name.
	checkLease func(string) error
	// window returns the renewal window at a TTL (0: the backend's
	// default): how far ahead safe-until stays while renewals are healthy,
	// or why the TTL does not work with the backend. Nil means the
	// baton.Config defaults: TTL - RenewInterval - DriftMargin.
	window func(ttl time.Duration) (time.Duration, error)
}

// opener connects to a backend described by a parsed URL.
type opener func(ctx context.Context, o backendOptions) (*openBackend, error)

// backendOptions are the settings every backend takes from common flags.
type backendOptions struct {
	// TTL is --ttl, or 0 when it was not given: the backend's default
	// (baton.DefaultTTL, but 20 s on Consul).
	TTL    time.Duration
	Logger *slog.Logger
	// raft holds the member flags of commands that may run a member (run,
	// agent); nil elsewhere.
	raft *raftFlags
}

// openBackend is a connected backend and how to let go of it.
type openBackend struct {
	baton.Backend
	// node is the raft member this process runs, with raft://; else nil.
	node *raft.Node
	// close releases the backend and whatever the CLI created for it (the
	// etcd client); it is safe to call once.
	close func(ctx context.Context) error
}

// backendSpec is a validated --backend URL.
type backendSpec struct {
	scheme     string
	open       opener
	checkLease func(string) error
	window     func(time.Duration) (time.Duration, error)
	// hosts are the servers' hosts named in the URL (none for raft:// and
	// memory://), each checked by checkHost.
	hosts []string
}

// raftWindow is the raft backend's renewal window (raft:// and agent://),
// at its own default TTL when ttl is 0.
func raftWindow(ttl time.Duration) (time.Duration, error) {
	return raft.Options{Config: baton.Config{TTL: ttl}}.RenewalWindow()
}

// renewalWindow returns the backend's renewal window at ttl (see
// backendScheme.window).
func (s *backendSpec) renewalWindow(ttl time.Duration) (time.Duration, error) {
	if s.window != nil {
		return s.window(ttl)
	}
	timing, err := (baton.Config{TTL: ttl}).WithDefaults()
	if err != nil {
		return 0, err
	}
	return timing.TTL - timing.RenewInterval - timing.DriftMargin, nil
}

// etcdDialTimeout bounds etcd's authentication round trip (and, plus a
// second, its lease keep-alive requests); connecting itself is lazy, and
// opening the client is also bounded by each command's context.
const etcdDialTimeout = 5 * time.Second

func supportedSchemes() string {
	forms := make([]string, 0, len(backendSchemes))
	for _, s := range backendSchemes {
		forms = append(forms, s.form)
	}
	slices.Sort(forms)
	return strings.Join(forms, ", ")
}

// parseBackend checks a --backend URL and returns how to open it. The error
// says what is wrong and what a valid URL looks like.
func parseBackend(raw string) (*backendSpec, error) {
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("not a backend URL: write SCHEME://..., e.g. etcd://%s; supported: %s",
			strings.TrimPrefix(raw, "//"), supportedSchemes())
	}
	s, known := backendSchemes[strings.ToLower(scheme)]
	if !known {
		return nil, fmt.Errorf("unknown backend scheme %q: supported are %s", scheme, supportedSchemes())
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse refuses some forms that the scheme parsers explain
		// better (it refuses "h:99999" and "a:1,b:2"); split the URL
		// by hand, with the same rules for % escapes.
		u, err = splitURL(raw)
		if err != nil {
			return nil, fmt.Errorf("malformed URL: %v; use %s", err, s.form)
		}
	}
	hosts, err := checkURLParts(u, s.form)
	if err != nil {
		return nil, err
	}
	open, err := s.parse(u)
	if err != nil {
		return nil, err
	}
	return &backendSpec{scheme: strings.ToLower(scheme), open: open, checkLease: s.checkLease, window: s.window, hosts: hosts}, nil
}

// escapeHint tells how to write what a bad % escape was meant to be.
const escapeHint = "write a literal % as %25"

// splitURL separates scheme://[user[:password]@]authority[/path][?query]
// without url.Parse's checks of the authority, decoding the user
// information and path as url.Parse would. The authority is left as it is
// for checkURLParts, which refuses a % in it.
func splitURL(raw string) (*url.URL, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	if strings.ContainsAny(rest, " \t\n") {
		return nil, errors.New("it contains white space")
	}
	rest, query, _ := strings.Cut(rest, "?")
	host, path, hasPath := strings.Cut(rest, "/")
	var user *url.Userinfo
	if at := strings.LastIndexByte(host, '@'); at >= 0 {
		u, p, hasP := strings.Cut(host[:at], ":")
		var err error
		if u, err = url.PathUnescape(u); err != nil {
			return nil, fmt.Errorf("user name: %v: %s", err, escapeHint)
		}
		if hasP {
			if p, err = url.PathUnescape(p); err != nil {
				// Not the password itself: it must not reach logs.
				return nil, fmt.Errorf("password: a %% is not followed by two hex digits: %s", escapeHint)
			}
			user = url.UserPassword(u, p)
		} else {
			user = url.User(u)
		}
		host = host[at+1:]
	}
	if hasPath {
		p, err := url.PathUnescape("/" + path)
		if err != nil {
			return nil, fmt.Errorf("path %q: %v: %s", "/"+path, err, escapeHint)
		}
		path = p
	}
	return &url.URL{Scheme: scheme, User: user, Host: host, Path: path, RawQuery: query}, nil
}

// checkURLParts checks what every scheme's parser takes for granted: that
// the query is well formed (url.URL.Query drops bad pairs silently), and
// that each comma-separated server in the authority is a host name or an
// IP address, with an optional port the scheme's parser checks. A host
// that no client can dial (a stray %, a space, an IPv6 zone) is a usage
// error here rather than a connection that fails at run time. It returns
// the hosts, for tests.
func checkURLParts(u *url.URL, form string) ([]string, error) {
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return nil, fmt.Errorf("query %q: %v: %s (%s)", u.RawQuery, err, escapeHint, form)
	}
	if u.Host == "" {
		return nil, nil
	}
	var hosts []string
	for _, ep := range strings.Split(u.Host, ",") {
		host := ep
		switch {
		case strings.HasPrefix(ep, "["):
			end := strings.IndexByte(ep, ']')
			if end < 0 {
				return nil, fmt.Errorf("server %q: an IPv6 address in [ has no closing ]: use %s", ep, form)
			}
			host = ep[1:end]
			if rest := ep[end+1:]; rest != "" && !strings.HasPrefix(rest, ":") {
				return nil, fmt.Errorf("server %q: after ] comes :PORT or nothing: use %s", ep, form)
			}
		case strings.Count(ep, ":") == 1:
			host, _, _ = strings.Cut(ep, ":")
		}
		if host == "" {
			continue // the scheme's parser names the missing host
		}
		if err := checkHost(host); err != nil {
			return nil, fmt.Errorf("server %q: %v: use %s", ep, err, form)
		}
		hosts = append(hosts, host)
	}
	return hosts, nil
}

// checkHost accepts an IP address without a zone, or a DNS name in ASCII.
func checkHost(host string) error {
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return fmt.Errorf("IPv6 zone %%%s: addresses with a zone are not supported; use a global or unique-local address, or a host name", ip.Zone())
		}
		return nil
	}
	if strings.Contains(host, ":") {
		return fmt.Errorf("%q is not an IPv6 address", host)
	}
	for _, r := range host {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
		case r > 0x7f:
			return fmt.Errorf("host %q is not ASCII: write an international domain name in its xn-- (punycode) form", host)
		default:
			return fmt.Errorf("host %q contains %q: a host is a name of letters, digits, '-', '.' and '_', or an IP address", host, r)
		}
	}
	return nil
}

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
	return func(ctx context.Context, o backendOptions) (*openBackend, error) {
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
				return nil, usageErrorf("etcd %s refused user %q: %v; check user:password@ in the URL", strings.Join(endpoints, ","), username, err)
			}
			return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(endpoints, ","), err)
		}
		b, err := etcd.New(client, etcd.Options{
			Config: baton.Config{TTL: o.TTL},
			Logger: o.Logger,
		})
		if err != nil {
			_ = client.Close()
			ccancel()
			return nil, err
		}
		return &openBackend{Backend: b, close: func(ctx context.Context) error {
			// The backend does not own the client (it was handed in), so
			// close both: the backend first, to revoke its session.
			defer ccancel()
			return errors.Join(b.Close(ctx), client.Close())
		}}, nil
	}, nil
}

// checkEtcdLease mirrors the etcd backend's rule: elections "a" and "a/b"
// would share a key prefix.
func checkEtcdLease(name string) error {
	if strings.Contains(name, "/") {
		return errors.New(`etcd lease names must not contain "/" (the key prefixes of leases "a" and "a/b" would overlap): use e.g. "-" instead`)
	}
	return nil
}

// parseMemoryURL accepts only memory://: the store lives in this process.
func parseMemoryURL(u *url.URL) (opener, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("memory URLs take nothing after the scheme: use memory:// (the store lives inside this baton process)")
	}
	return func(_ context.Context, o backendOptions) (*openBackend, error) {
		b, err := memory.New(memory.NewStore(), memory.Options{
			Config: baton.Config{TTL: o.TTL},
			Logger: o.Logger,
		})
		if err != nil {
			return nil, err
		}
		return &openBackend{Backend: b, close: b.Close}, nil
	}, nil
}
