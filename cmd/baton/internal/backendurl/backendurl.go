// Package backendurl opens a baton.Backend named by a URL, as the baton
// command's --backend does:
//
//	etcd://[user:password@]host[:port][,host[:port]...]      port 2379
//	zk://[user:password@]host[:port][,...][/root][?tls params] port 2181
//	consul://host[:port][/prefix][?params]                   port 8500
//	postgres://[user[:password]@]host[:port][,...][/db][?params]  libpq's URL; postgresql:// too
//	dynamodb://TABLE[?region=R&profile=P&endpoint=URL&poll=D] a DynamoDB table; the SDK's region, credentials
//	redis://[user[:password]@]host[:port][/db][?params]      rediss:// for TLS
//	redis+sentinel://[user[:password]@]s1[:port][,s2...]/MASTER[/db]  Sentinel; rediss+sentinel:// for TLS
//	agent://[token@]/path/to/agent.sock                       a raft agent's Unix socket
//	agent://[token@]host:port                                 a raft agent (its socket on this host)
//	raft://                                                   a raft member
//	memory://                                                 this process only
//
// Parse checks a URL without connecting, so that a mistake is reported
// before anything starts; the error says what is wrong and what a valid URL
// looks like. The returned Spec checks lease names against the backend's
// own rules (each backend package's, not a copy), answers the renewal
// window at a TTL, and opens the backend.
//
// Other backends come as Schemes from outside (the baton command's k8s://,
// on client-go), which Parse accepts beside its own.
//
// A program that names its backend in code needs none of this: it calls
// the backend package's New. This package imports the etcd, ZooKeeper,
// Consul, PostgreSQL, Redis and raft backends, each a module of its own with its client, which
// is why it is part of the CLI's module and of no library module.
package backendurl

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/backend/raft"
)

// schemes maps a URL scheme to its backend: the one place that does, so
// that the set is visible.
var schemes = map[string]scheme{
	"etcd":   {form: "etcd://host:port[,host:port]", parse: parseEtcdURL, checkLease: etcdLease, window: etcdWindow},
	"memory": {form: "memory://", parse: parseMemoryURL},
	"raft":   {form: "raft:// (this process is a member of the group)", parse: parseRaftURL, window: raftWindow},
	"agent":  {form: "agent:///path/to/agent.sock or agent://host:port", parse: parseAgentURL, window: raftWindow},
	"zk":     {form: "zk://host:port[,host:port][/root]", parse: parseZooKeeperURL, checkLease: zooKeeperLease, window: zooKeeperWindow},
	"consul": {form: "consul://host:port[/prefix]", parse: parseConsulURL, checkLease: consulLease, window: consulWindow},
	// libpq's URLs, which net/url cannot split (host lists), go to pgx whole.
	"postgres":   {form: "postgres://[user[:password]@]host[:port][,host:port][/db][?params]", parseRaw: parsePostgresURL, window: postgresWindow},
	"postgresql": {form: "postgresql://... (as postgres://)", parseRaw: parsePostgresURL, window: postgresWindow},
	"dynamodb":   {form: "dynamodb://TABLE[?region=R&profile=P&endpoint=URL&poll=D]", parseRaw: parseDynamoURL, checkLease: dynamoLease},
	// Sentinel URLs list several sentinels, which net/url cannot split.
	"redis":           {form: "redis://[user[:password]@]host[:port][/db][?params]", parseRaw: parseRedisURL},
	"rediss":          {form: "rediss://... (as redis://, over TLS)", parseRaw: parseRedisURL},
	"redis+sentinel":  {form: "redis+sentinel://[user[:password]@]sentinel[:port][,sentinel...]/master[/db][?params]", parseRaw: parseRedisURL},
	"rediss+sentinel": {form: "rediss+sentinel://... (as redis+sentinel://, over TLS)", parseRaw: parseRedisURL},
	// Known, so that the refusal explains itself.
	"redis+cluster": {form: "redis+cluster:// (refused: Redis Cluster is not supported)", parseRaw: parseRedisURL},
}

type scheme struct {
	form  string                         // the URL form, for messages
	parse func(*url.URL) (opener, error) // checks the URL without connecting
	// parseRaw, if set instead of parse, checks the URL as a whole
	// string, and returns its hosts too.
	parseRaw func(raw string) (opener, []string, error)
	// checkLease rejects lease names the backend cannot take, so that the
	// mistake is a usage error rather than a campaign retried forever. Nil
	// accepts any non-empty name.
	checkLease func(string) error
	// window returns the renewal window at a TTL (0: the backend's
	// default), or why the TTL does not work with the backend. Nil means
	// the backend.Config defaults: TTL - RenewInterval - DriftMargin.
	window func(ttl time.Duration) (time.Duration, error)
}

// opener connects to a backend described by a parsed URL.
type opener func(ctx context.Context, o Options) (*Backend, error)

// Options are the settings Spec.Open gives every backend. The zero value
// means the documented defaults.
type Options struct {
	// TTL of the leases; 0 means the backend's default (backend.DefaultTTL,
	// but 20 s on Consul and raft.DefaultTTL, 5 s, on raft:// and agent://).
	TTL time.Duration

	// Logger receives the backend's log lines. Nil means silent.
	Logger *slog.Logger

	// Member starts this process's member of a raft group and returns it
	// once it is in the group, for raft://. Nil (the default) refuses
	// raft://: a member's settings (addresses, TLS, secret, discovery)
	// are more than a URL holds.
	Member func(ctx context.Context) (*raft.Node, error)

	// AgentClient returns where and how an agent:// client reaches its
	// agent (the address or socket path raft.Dial takes, and the client
	// options), given the URL's HOST:PORT (addr, "" for agent:///PATH), its
	// socket path (socket, "" for agent://HOST:PORT) and its token (""
	// when it names none). Its error is a usage error. Nil means the URL
	// as it is: raft.Dial of the socket, or of HOST:PORT, where no
	// credential is sent (reads work; calls that change something fail
	// with raft.ErrUnprovenAgent).
	AgentClient func(addr, socket, token string) (dial string, opts raft.ClientOptions, err error)

	// CloseTimeout bounds closing a raft member that Open started and then
	// could not use. Default 5 s.
	CloseTimeout time.Duration
}

// Backend is an open backend and what Open created for it.
type Backend struct {
	baton.Backend
	// Node is the raft member this process runs, with raft://; else nil.
	Node  *raft.Node
	close func(ctx context.Context) error
}

// Close releases the backend and whatever Open created for it (the etcd
// client, the raft member). Call it once.
func (b *Backend) Close(ctx context.Context) error { return b.close(ctx) }

// SettingsError is an error in what the caller gave, found while opening:
// a file named in the URL, credentials a server refused, options the
// backend refuses for good. Retrying cannot help.
type SettingsError struct{ Err error }

// Error returns the underlying error's message.
func (e *SettingsError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *SettingsError) Unwrap() error { return e.Err }

func settingsErrorf(format string, args ...any) error {
	return &SettingsError{Err: fmt.Errorf(format, args...)}
}

// Spec is a checked backend URL. Safe for concurrent use, except Open on
// the same Spec.
type Spec struct {
	// Scheme is the URL's scheme in lower case: etcd, zk, consul, agent,
	// raft, memory, postgres (for postgresql:// too), or the Name of a
	// Scheme given to Parse.
	Scheme string
	// Hosts are the servers' hosts named in the URL (none for raft://,
	// memory:// and agent:///PATH).
	Hosts []string
	// Socket is the Unix socket of agent:///PATH; empty for any other URL.
	Socket string

	s    scheme
	open opener
}

// CheckLease returns why the backend cannot take lease name, or nil.
func (s *Spec) CheckLease(name string) error {
	if s.s.checkLease == nil {
		return nil
	}
	return s.s.checkLease(name)
}

// RenewalWindow returns how far ahead safe-until stays while renewals are
// healthy, at worst, with leases of ttl (0: the backend's default), or why
// ttl does not work with the backend. Work that must stop before
// safe-until (baton.ElectorConfig.StopEarly) must fit in it.
func (s *Spec) RenewalWindow(ttl time.Duration) (time.Duration, error) {
	if s.s.window != nil {
		return s.s.window(ttl)
	}
	timing, err := (backend.Config{TTL: ttl}).WithDefaults()
	if err != nil {
		return 0, err
	}
	return timing.TTL - timing.RenewInterval - timing.DriftMargin, nil
}

// TTL returns the TTL in force at ttl: ttl itself, or the backend's
// default when ttl is 0 (raft.DefaultTTL on raft:// and agent://,
// consul.DefaultTTL on consul://, backend.DefaultTTL elsewhere), for
// messages that name it.
func (s *Spec) TTL(ttl time.Duration) time.Duration {
	if ttl != 0 {
		return ttl
	}
	return DefaultTTL(s.Scheme)
}

// DefaultTTL returns the TTL a backend of scheme (case-insensitive) runs
// at when none is given: raft.DefaultTTL on raft:// and agent://,
// consul.DefaultTTL on consul://, backend.DefaultTTL elsewhere.
func DefaultTTL(scheme string) time.Duration {
	switch strings.ToLower(scheme) {
	case "raft", "agent":
		return raft.DefaultTTL
	case "consul":
		return consul.DefaultTTL
	}
	return backend.DefaultTTL
}

// Open connects to the backend, within ctx; the backend lives past ctx,
// until Backend.Close.
func (s *Spec) Open(ctx context.Context, o Options) (*Backend, error) {
	if o.CloseTimeout == 0 {
		o.CloseTimeout = 5 * time.Second
	}
	return s.open(ctx, o)
}

// Scheme is a backend URL scheme built outside this package, for a
// backend this package does not import: the baton command
// adds k8s:// (package backend/kubernetes, on client-go) this way. Parse
// accepts the Schemes it is given beside its own.
type Scheme struct {
	// Name is the URL scheme, matched without regard to case. A built-in
	// scheme's name is never handed to a Scheme.
	Name string

	// Form shows how the scheme's URLs are written, e.g. "k8s://[NAMESPACE]";
	// Parse's errors about any URL list it among the supported forms.
	Form string

	// Parse checks the whole URL, without connecting, and returns how to
	// open it; its error says what is wrong and shows Form. It must not
	// panic on any input, and its error must not hold a password.
	Parse func(raw string) (Opener, error)

	// CheckLease rejects lease names the backend cannot take (a usage
	// error rather than a campaign retried forever). Nil accepts any
	// non-empty name.
	CheckLease func(name string) error

	// Window returns the renewal window at a TTL (0: the backend's
	// default), or why the TTL does not work with the backend. Nil means
	// the backend.Config defaults: TTL - RenewInterval - DriftMargin.
	Window func(ttl time.Duration) (time.Duration, error)
}

// Opener opens the backend of a URL that a Scheme parsed, within ctx, and
// returns it with the function that releases it and whatever was made for
// it (its client). An error in what the user gave, which retrying cannot
// fix (a kubeconfig that cannot be read, say), is a *SettingsError.
type Opener func(ctx context.Context, o Options) (b baton.Backend, close func(context.Context) error, err error)

// Forms lists the URL form of every built-in scheme, for messages.
func Forms() string { return forms(nil) }

// forms lists the URL form of every built-in scheme and of extra.
func forms(extra []Scheme) string {
	out := make([]string, 0, len(schemes)+len(extra))
	for _, s := range schemes {
		out = append(out, s.form)
	}
	for _, x := range extra {
		out = append(out, x.Form)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// Parse checks a backend URL of a built-in scheme or of one of extra, and
// returns how to open it. The error says what is wrong and what a valid
// URL looks like; it never holds the URL's password.
func Parse(raw string, extra ...Scheme) (*Spec, error) {
	name, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("not a backend URL%s: write SCHEME://...; supported: %s",
			didYouMean(raw, extra), forms(extra))
	}
	if _, known := schemes[strings.ToLower(name)]; !known && !slices.ContainsFunc(extra, func(x Scheme) bool { return strings.EqualFold(name, x.Name) }) {
		return nil, fmt.Errorf("unknown backend scheme %q%s: supported are %s", name, didYouMean(raw, extra), forms(extra))
	}
	return parse(raw, extra)
}

// parse is Parse of a URL with a scheme, without suggestions.
func parse(raw string, extra []Scheme) (*Spec, error) {
	name, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("not a backend URL: write SCHEME://...; supported: %s", forms(extra))
	}
	s, known := schemes[strings.ToLower(name)]
	if !known {
		for _, x := range extra {
			if strings.EqualFold(name, x.Name) {
				return parseExtra(raw, x)
			}
		}
		return nil, fmt.Errorf("unknown backend scheme %q: supported are %s", name, forms(extra))
	}
	if s.parseRaw != nil {
		open, hosts, err := s.parseRaw(raw)
		if err != nil {
			return nil, err
		}
		// postgresql:// is postgres:// by another name.
		return &Spec{Scheme: strings.TrimSuffix(strings.ToLower(name), "ql"), Hosts: hosts, s: s, open: open}, nil
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
	spec := &Spec{Scheme: strings.ToLower(name), Hosts: hosts, s: s, open: open}
	if spec.Scheme == "agent" && u.Host == "" {
		spec.Socket = u.Path
	}
	return spec, nil
}

// parseExtra parses raw with x, a Scheme from outside this package.
func parseExtra(raw string, x Scheme) (*Spec, error) {
	open, err := x.Parse(raw)
	if err != nil {
		return nil, err
	}
	return &Spec{
		Scheme: strings.ToLower(x.Name),
		s:      scheme{form: x.Form, checkLease: x.CheckLease, window: x.Window},
		open: func(ctx context.Context, o Options) (*Backend, error) {
			b, closeFn, err := open(ctx, o)
			if err != nil {
				return nil, err
			}
			return &Backend{Backend: b, close: closeFn}, nil
		},
	}, nil
}

// Redact hides the password of a URL's user information
// (scheme://user:password@host) and the values of its password and
// sslpassword query parameters (libpq's), for messages and logs.
func Redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	if i := strings.Index(rest, "?"); i >= 0 {
		rest = rest[:i+1] + redactQuery(rest[i+1:])
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndexByte(authority, '@')
	if at < 0 {
		return scheme + "://" + rest
	}
	user, _, hasPass := strings.Cut(authority[:at], ":")
	if !hasPass {
		return scheme + "://" + rest
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// redactQuery hides the values of password parameters in a raw query, and
// the passwords of URLs in its values (postgres:// takes a baton_listen).
func redactQuery(q string) string {
	parts := strings.Split(q, "&")
	for i, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		key, kerr := url.QueryUnescape(k)
		val, verr := url.QueryUnescape(v)
		switch {
		case kerr != nil || verr != nil || strings.Contains(strings.ToLower(key), "password"):
			parts[i] = k + "=xxxxx"
		case strings.Contains(val, "://"):
			parts[i] = k + "=" + url.QueryEscape(Redact(val))
		}
	}
	return strings.Join(parts, "&")
}
