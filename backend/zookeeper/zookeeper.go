package zookeeper

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/epoch"
	"github.com/batonhq/baton/internal/renew"
	"github.com/go-zookeeper/zk"
)

// DefaultRoot is the parent of the latch paths when Options.Root is empty.
const DefaultRoot = "/baton"

// Options configures a Backend. The zero value means the documented defaults.
type Options struct {
	backend.
		// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s,
		// TTL/6, TTL/10; RenewInterval is shorter than elsewhere because a
		// renewal confirms less on ZooKeeper: see ensembleLag). TTL is the ZooKeeper session timeout that Dial asks for; the
		// server grants it clamped into [minSessionTimeout, maxSessionTimeout]
		// (by default 2 to 20 of its ticks), and the Backend then times
		// safe-until by what it granted (see Probe).
		Config

	// Root is the ZooKeeper path under which each lease NAME has its latch
	// path, Root + "/" + NAME: the path a Curator LeaderLatch would be given
	// to join the same election. Empty means DefaultRoot ("/baton"); "/"
	// puts latch paths at the top of the tree. Missing nodes on the way are
	// created as container nodes, as Curator creates them. The leases'
	// states live under Root + "/.baton-state" (see StatePath), so no
	// segment of Root may be ".baton-state".
	Root string

	// ACL is given to every node the Backend creates: the candidates'
	// latch nodes, the leases' state nodes, and any missing parent. Nil (the default) means
	// zk.WorldACL(zk.PermAll), Curator's default too: anyone may read and
	// delete. With digest authentication, something like
	// append(zk.DigestACL(zk.PermAll, user, password), zk.WorldACL(zk.PermRead)...)
	// lets only that user take part while others, Curator's getLeader
	// included, may still watch. Parents that exist already keep their ACL.
	ACL []zk.ACL

	// Probe, if the caller's connection was made with its Dial (see
	// SessionProbe), tells the Backend the session timeout the server
	// negotiated, which then times safe-until. Nil means the negotiated
	// timeout is taken to be TTL: make sure the server grants what the
	// connection asks for, or a holder could act after its session
	// expired. A probe that has not seen the session granted (the
	// connection was not dialed through it) fails campaigns with
	// baton.ErrBackendUnavailable rather than guess. Dial always sets it.
	Probe *SessionProbe

	// Logger receives log lines (group "zookeeper"). Nil (the default)
	// means silent.
	Logger *slog.Logger
}

// DialOptions configures Dial. The zero value means the documented defaults.
type DialOptions struct {
	// Options configures the Backend; Probe is ignored, as Dial makes its
	// own.
	Options

	// TLS, if not nil, makes every connection TLS with this configuration:
	// the servers' addresses must be their secureClientPort. A client
	// certificate in it authenticates the session under ZooKeeper's x509
	// scheme where the server enables it. Nil (the default) means plain
	// TCP.
	TLS *tls.Config

	// Digest, if not empty, is "user:password" for ZooKeeper's digest
	// authentication, added to the session before the Backend is returned
	// and again on every reconnection. Pair it with an ACL naming the user
	// (zk.DigestACL) so that other clients cannot delete the Backend's nodes.
	Digest string
}

// Backend runs baton leases on ZooKeeper over one session, using the node
// layout of Apache Curator's LeaderLatch. It is safe for concurrent use. One
// Backend stands for one process; it may hold any number of leases.
type Backend struct {
	conn  *zk.Conn
	owned bool // Close closes conn
	cfg   backend.Config
	root  string
	acl   []zk.ACL
	probe *SessionProbe
	log   *slog.Logger

	// ctx bounds the Backend's background work; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the Backend's own goroutines

	// calls counts the goroutines waiting for the client's replies (see
	// call); once callsDone is set, under callMu, no more start, so that
	// Close can wait for them.
	calls     sync.WaitGroup
	callMu    sync.Mutex
	callsDone bool

	// starting admits one caller at a time to start a session generation,
	// so that a burst of first campaigns shares one; a channel so that
	// waiting honours the caller's ctx.
	starting chan struct{}

	mu     sync.Mutex
	closed bool
	sess   *session           // nil before the first campaign and after a generation ended
	nodes  map[*node]struct{} // every node made, or maybe made, and not known to be gone
	// slots, guarded by mu, marks the lease names this Backend campaigns
	// for or holds, so that one Backend has at most one latch node per name
	// (see the etcd backend). While a node of a name is being deleted in
	// the background, the name stays claimed.
	slots *renew.Slots

	// epochs follows the epoch node as read (see epochNode).
	epochs epoch.Tracker
	// now is the wall clock an epoch created is taken from.
	now func() time.Time
}

var _ baton.Backend = (*Backend)(nil)

// node is a latch node this Backend made, or may have made: a create whose
// reply was lost is known only by its protected prefix until a listing of
// the latch's children finds it or proves it absent.
type node struct {
	latch  string // the latch path, the node's parent
	prefix string // "_c_<UUID>-": the node's name starts with it
	// path is the node's full path once known; guarded by Backend.mu, as
	// Close reads it while a campaign may set it.
	path string
}

// New returns a Backend that campaigns through conn. The connection remains
// the caller's: Close does not close it, and instead deletes the Backend's
// nodes. Use one Backend per connection. If conn should authenticate
// (digest), call conn.AddAuth first.
func New(conn *zk.Conn, opts Options) (*Backend, error) {
	cfg, root, acl, err := opts.validate()
	if err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, &baton.ConfigError{Problems: []string{"zookeeper: conn is nil: pass a *zk.Conn from zk.Connect, or use zookeeper.Dial"}}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		conn:     conn,
		cfg:      cfg,
		root:     root,
		acl:      acl,
		probe:    opts.Probe,
		log:      log.WithGroup("zookeeper"),
		ctx:      ctx,
		cancel:   cancel,
		starting: make(chan struct{}, 1),
		nodes:    map[*node]struct{}{},
		now:      time.Now,
	}
	b.slots = renew.NewSlots(&b.mu, func() bool { return b.closed }, "ZooKeeper")
	return b, nil
}

// Validate reports every problem with o at once, as a *baton.ConfigError,
// or nil: what New and Dial would refuse, checked without a connection
// (for a CLI, say, to report a usage error before it dials).
func (o Options) Validate() error {
	_, _, _, err := o.validate()
	return err
}

// ensembleLag is how long before a confirmed renewal was sent the
// ZooKeeper leader, which expires sessions, may last have heard from the
// client, for a session timeout of timeout. A client connected to a
// follower is heard by the leader only through the follower's replies to
// the leader's pings, every half tick; should the follower lose the leader
// just after it answered a renewal, the leader's last word of the client
// may be the request before it: up to RenewInterval earlier (our renewals
// are never further apart), plus half a tick. The tick is the server's and
// unknown here, but a negotiated timeout is at least minSessionTimeout,
// 2 ticks by default, so half a tick is at most timeout/4. Safe-until is
// measured from the renewal's send time minus this lag. A standalone
// server has no lag; the bound is kept anyway, as a client cannot tell.
func ensembleLag(cfg backend.Config, timeout time.Duration) time.Duration {
	return timeout/4 + cfg.RenewInterval
}

// safeWindow is how far ahead of a renewal's next due time safe-until
// stays while renewals are confirmed at once, for a session timeout of
// timeout: the renewal window that `baton run --grace` must fit in.
func safeWindow(cfg backend.Config, timeout time.Duration) time.Duration {
	return timeout - ensembleLag(cfg, timeout) - cfg.DriftMargin - cfg.RenewInterval
}

// RenewalWindow returns how far ahead safe-until stays, at worst, while
// renewals are healthy, if the server grants the TTL asked for: the TTL
// less the ensemble lag (TTL/4 + RenewInterval, see the package doc), the
// drift margin and one renew interval. A holder's work must be able to stop
// within it once renewals start failing. It returns an error for options
// that New would refuse.
func (o Options) RenewalWindow() (time.Duration, error) {
	cfg, _, _, err := o.validate()
	if err != nil {
		return 0, err
	}
	return safeWindow(cfg, cfg.TTL), nil
}

// validate applies the defaults and reports every problem at once.
func (o Options) validate() (backend.Config, string, []zk.ACL, error) {
	var problems []string
	c := o.Config
	if c.TTL == 0 {
		c.TTL = backend.DefaultTTL
	}
	if c.TTL > 0 && c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 6 // see ensembleLag
	}
	cfg, err := c.WithDefaults()
	var cerr *baton.ConfigError
	if errors.As(err, &cerr) {
		problems = append(problems, cerr.Problems...)
	} else if err != nil {
		return cfg, "", nil, err
	}
	if err == nil {
		if w := safeWindow(cfg, cfg.TTL); w <= 0 {
			problems = append(problems, fmt.Sprintf("RenewInterval (%s) is too long for TTL %s on ZooKeeper: a renewal confirms the session only up to TTL - TTL/4 - RenewInterval - DriftMargin ahead (see the package doc), which must exceed RenewInterval; renew more often (the default is TTL/6) or lower DriftMargin",
				cfg.RenewInterval, cfg.TTL))
		}
	}
	root := o.Root
	if root == "" {
		root = DefaultRoot
	}
	if err := checkRoot(root); err != nil {
		problems = append(problems, err.Error())
	}
	if cfg.TTL > time.Duration(1<<31-1)*time.Millisecond {
		problems = append(problems, fmt.Sprintf("TTL (%s) is beyond ZooKeeper's session timeouts, which are 32-bit milliseconds", cfg.TTL))
	}
	acl := o.ACL
	if acl == nil {
		acl = zk.WorldACL(zk.PermAll)
	} else if len(acl) == 0 {
		problems = append(problems, "ACL is empty: ZooKeeper refuses to create nodes without an ACL; leave it nil for zk.WorldACL(zk.PermAll)")
	}
	if len(problems) > 0 {
		return cfg, "", nil, &baton.ConfigError{Problems: problems}
	}
	return cfg, root, acl, nil
}

// checkRoot accepts "/" or an absolute ZooKeeper path without a trailing
// "/", empty segments, "." or "..".
func checkRoot(root string) error {
	if root == "/" {
		return nil
	}
	if !strings.HasPrefix(root, "/") || strings.HasSuffix(root, "/") {
		return fmt.Errorf("zookeeper: Root %q must be an absolute path without a trailing \"/\", such as %q", root, DefaultRoot)
	}
	for _, seg := range strings.Split(root[1:], "/") {
		if err := checkSegment(seg); err != nil {
			return fmt.Errorf("zookeeper: Root %q: %v", root, err)
		}
		if seg == stateDir {
			return fmt.Errorf("zookeeper: Root %q must not have a segment %q: that name holds the lease states of the Root above it, whose nodes would be taken for latch paths", root, stateDir)
		}
		if seg == epochNode {
			return fmt.Errorf("zookeeper: Root %q must not have a segment %q: that name holds the epoch of the Root above it", root, epochNode)
		}
	}
	return nil
}

// checkSegment applies ZooKeeper's rules for one path segment
// (PathUtils.validatePath), so that a bad name fails with a clear message
// before any request.
func checkSegment(seg string) error {
	switch seg {
	case "":
		return errors.New("empty path segment (\"//\")")
	case ".", "..":
		return fmt.Errorf("%q is not allowed as a path segment", seg)
	}
	if !utf8.ValidString(seg) {
		return fmt.Errorf("%q is not valid UTF-8", seg)
	}
	for _, r := range seg {
		switch {
		case r <= 0x1f, 0x7f <= r && r <= 0x9f, 0xd800 <= r && r <= 0xf8ff, 0xfff0 <= r && r <= 0xffff:
			return fmt.Errorf("%q holds character %U, which ZooKeeper refuses in paths", seg, r)
		}
	}
	return nil
}

// CheckName reports whether name can be a lease name: not empty, without
// "/" (the latch paths of leases "a" and "a/b" would nest, so each would
// count the other's parent node as a candidate; put shared path segments
// in Options.Root), not ".baton-state" (Root + "/.baton-state" holds the
// leases' states) nor ".baton-epoch" (Root + "/.baton-epoch" holds the
// epoch of tokens), and allowed by ZooKeeper in a path.
func CheckName(name string) error {
	if name == "" {
		return errors.New("zookeeper: lease name must not be empty")
	}
	if strings.Contains(name, "/") {
		return fmt.Errorf("zookeeper: lease name %q must not contain \"/\": latch path %q would then hold latch %q's node, which Curator and baton would take for a candidate; put shared path segments in Options.Root",
			name, name, name[:strings.IndexByte(name, '/')])
	}
	if err := checkSegment(name); err != nil {
		return fmt.Errorf("zookeeper: lease name: %v", err)
	}
	if name == stateDir {
		return fmt.Errorf("zookeeper: lease name %q is reserved: Root + \"/%s\" holds the lease states, whose nodes Curator and baton would take for candidates", name, stateDir)
	}
	if name == epochNode {
		return fmt.Errorf("zookeeper: lease name %q is reserved: Root + \"/%s\" holds the epoch that tokens start from", name, epochNode)
	}
	return nil
}

// Dial connects to the ZooKeeper ensemble at servers ("host:port"; the
// port defaults to 2181) with a session timeout of opts.TTL, waits within
// ctx for a session (and adds opts.Digest to it), and returns a Backend
// that owns the connection: its Close closes the session, which deletes
// the Backend's nodes on the server at once.
func Dial(ctx context.Context, servers []string, opts DialOptions) (*Backend, error) {
	cfg, _, _, err := opts.validate()
	var problems []string
	var cerr *baton.ConfigError
	if errors.As(err, &cerr) {
		problems = append(problems, cerr.Problems...)
	} else if err != nil {
		return nil, err
	}
	if len(servers) == 0 {
		problems = append(problems, "zookeeper: no servers: name at least one, as in 127.0.0.1:2181")
	}
	for _, s := range servers {
		if strings.TrimSpace(s) == "" {
			problems = append(problems, "zookeeper: a server address is empty")
		}
	}
	if opts.Digest != "" && !strings.Contains(opts.Digest, ":") {
		problems = append(problems, "zookeeper: Digest must be \"user:password\"")
	}
	if len(problems) > 0 {
		return nil, &baton.ConfigError{Problems: problems}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	zlog := log.WithGroup("zookeeper").WithGroup("client")
	var base zk.Dialer = net.DialTimeout
	if opts.TLS != nil {
		base = tlsDialer(opts.TLS)
	}
	probe := NewSessionProbe(base)
	conn, _, err := zk.Connect(servers, cfg.TTL,
		zk.WithDialer(probe.Dial),
		zk.WithLogger(clientLogger{zlog}),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession {
				zlog.Debug("connection state", "state", ev.State.String(), "server", ev.Server)
			}
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("zookeeper: connect to %s: %w", strings.Join(servers, ","), err)
	}
	opts.Probe = probe
	b, err := New(conn, opts.Options)
	if err != nil {
		conn.Close()
		return nil, err
	}
	b.owned = true
	// The first request waits for a session, so it tells whether the
	// servers (and the TLS set-up) work before anyone relies on them.
	if opts.Digest != "" {
		_, err = retry(ctx, b, nil, func() (struct{}, error) { return struct{}{}, conn.AddAuth("digest", []byte(opts.Digest)) })
	} else {
		_, err = retry(ctx, b, nil, func() (bool, error) { ok, _, err := conn.Exists("/"); return ok, err })
	}
	if err != nil {
		if ctx.Err() != nil {
			// No session: there is nothing to end on a server, but the
			// client's Close waits up to a second for the answer to its
			// close request, which a server that never answered will not
			// send. Return by ctx's deadline and let it finish on its own.
			go func() { _ = b.Close(context.Background()) }()
			return nil, fmt.Errorf("%w: zookeeper %s: no session before the context ended: %w", baton.ErrBackendUnavailable, strings.Join(servers, ","), ctx.Err())
		}
		_ = b.Close(context.Background())
		return nil, fmt.Errorf("%w: zookeeper %s: %w", baton.ErrBackendUnavailable, strings.Join(servers, ","), err)
	}
	return b, nil
}

// tlsDialer dials TLS with cfg; the client's connect timeout covers the
// handshake too.
func tlsDialer(cfg *tls.Config) zk.Dialer {
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: cfg}
		return d.Dial(network, address)
	}
}

// clientLogger sends go-zookeeper's log lines, chiefly its reconnection
// attempts, to slog at debug level: the Backend reports what matters.
type clientLogger struct{ log *slog.Logger }

func (l clientLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...))
}

// Config returns the timing the Backend uses, defaults filled in.
func (b *Backend) Config() backend.Config { return b.cfg }

// Conn returns the connection the Backend uses.
func (b *Backend) Conn() *zk.Conn { return b.conn }

// LatchPath returns the latch path of lease name: Root + "/" + name.
func (b *Backend) LatchPath(name string) string {
	if b.root == "/" {
		return "/" + name
	}
	return b.root + "/" + name
}

// call runs op, a request on the client, and waits for its reply until ctx
// ends. go-zookeeper's requests take no context: they wait for a reply, or
// for the connection to fail, which a partition can make take several
// session timeouts. Close abandons every call (with baton.ErrClosed). An
// abandoned op finishes in the background; its result is dropped, so op
// must not change anything the caller reads.
func call[T any](ctx context.Context, b *Backend, op func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	var zero T
	if !b.goCall(func() {
		v, err := op()
		done <- result{v, err}
	}) {
		return zero, baton.ErrClosed
	}
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-b.ctx.Done():
		return zero, baton.ErrClosed
	}
}

// goCall runs f in a goroutine counted in b.calls, unless Close stopped
// counting, and reports whether it did.
func (b *Backend) goCall(f func()) bool {
	b.callMu.Lock()
	defer b.callMu.Unlock()
	if b.callsDone {
		return false
	}
	b.calls.Go(f)
	return true
}

// retry is call, repeated while op fails because the client is between
// connections: go-zookeeper fails the requests it holds with ErrNoServer
// each time it has tried every server in vain, and those it had sent with
// ErrConnectionClosed when a connection breaks. Such a request did not
// happen, or (a create) is resolved by its caller, so asking again once
// the client is back is right. It gives up when ctx ends, the Backend
// closes, or session generation s (if not nil) ends, returning op's last
// error.
func retry[T any](ctx context.Context, b *Backend, s *session, op func() (T, error)) (T, error) {
	var done <-chan struct{}
	if s != nil {
		done = s.ctx.Done()
	}
	for {
		v, err := call(ctx, b, op)
		if err == nil || !transient(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-b.ctx.Done():
			return v, err
		case <-done:
			return v, err
		case <-time.After(retryPause):
		}
	}
}

// retryPause is how long retry waits before asking again.
const retryPause = 50 * time.Millisecond

// transient reports whether err says the client had no connection for the
// request, rather than that the server refused it.
func transient(err error) bool {
	return errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrConnectionClosed)
}

// Campaign implements baton.Backend. A second Campaign for a name this
// Backend already campaigns for or holds returns an error wrapping
// baton.ErrAlreadyCampaigning, whatever the candidate, as on etcd. The
// term it returns implements baton.StateTerm: its state lives at
// StatePath(name).
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if c.ID == "" {
		return nil, fmt.Errorf("zookeeper: candidate ID must not be empty (lease %q)", name)
	}
	return b.slots.Campaign(ctx, name, c.ID, func(sl *renew.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

func (b *Backend) campaign(ctx context.Context, sl *renew.Slot, name, id string) (baton.Term, error) {
	latch := b.LatchPath(name)
	var (
		s     *session
		n     *node
		czxid int64
		ep    uint64
	)
	for retried := false; ; retried = true {
		var err error
		if s, err = b.session(ctx); err != nil {
			return nil, err
		}
		n = &node{latch: latch, prefix: newProtectedPrefix()}
		var stat *zk.Stat
		stat, err = b.create(ctx, s, sl, name, n, id)
		if err == nil && stat.EphemeralOwner == s.id {
			czxid = stat.Czxid
			// Read after the node is made on s, and checked to be read on
			// s: both come from one incarnation of ZooKeeper's data.
			if ep, err = b.readEpoch(ctx, s, true); err == nil {
				break
			}
			b.dropNode(sl, name, n)
		}
		if err == nil {
			// The create ran on a newer session: the client found ours
			// expired and made another before our renewals noticed.
			b.dropNode(sl, name, n)
			b.endSession(s, b.lostErr(s))
			err = zk.ErrSessionExpired
		}
		if errors.Is(err, zk.ErrSessionExpired) && !retried {
			b.endSession(s, b.lostErr(s))
			continue
		}
		if errors.Is(err, baton.ErrLeaseLost) && ctx.Err() == nil {
			return nil, err
		}
		return nil, b.campaignErr(ctx, s, name, "create latch node under "+latch, err)
	}
	path := b.nodePath(n)
	b.log.Debug("campaigning", "lease", name, "node", path, "czxid", czxid)
	for {
		children, err := retry(ctx, b, s, func() ([]string, error) {
			c, _, err := b.conn.Children(latch)
			return c, err
		})
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			b.dropNode(sl, name, n)
			return nil, b.campaignErr(ctx, s, name, "list "+latch, err)
		}
		sortChildren(children)
		own := strings.TrimPrefix(path, latch+"/")
		i := indexOf(children, own)
		if i < 0 {
			if err := s.Err(); err != nil {
				return nil, b.campaignErr(ctx, s, name, "wait", err)
			}
			b.forget(n)
			return nil, fmt.Errorf("%w: latch node %s was deleted while waiting for lease %q", baton.ErrLeaseLost, path, name)
		}
		if i == 0 {
			return b.hold(s, sl, name, n, czxid, ep)
		}
		// Watch only the node just before ours, as Curator does: a
		// departure wakes one waiter, not the herd. getData rather than
		// exists, because an exists watch on a node already gone would
		// stay registered for nothing.
		pred := latch + "/" + children[i-1]
		type watched struct {
			ch <-chan zk.Event
		}
		w, err := retry(ctx, b, s, func() (watched, error) {
			_, _, ch, err := b.conn.GetW(pred)
			return watched{ch}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			continue // gone already: list again
		}
		if err != nil {
			b.dropNode(sl, name, n)
			return nil, b.campaignErr(ctx, s, name, "watch "+pred, err)
		}
		select {
		case <-w.ch:
			// Deleted, changed, or the watch was dropped (session expired,
			// client closed): the next listing tells which.
		case <-ctx.Done():
			b.dropNode(sl, name, n)
			return nil, ctx.Err()
		case <-s.ctx.Done():
			b.dropNode(sl, name, n)
			return nil, b.campaignErr(ctx, s, name, "wait for "+pred, s.Err())
		}
	}
}

func indexOf(children []string, name string) int {
	for i, c := range children {
		if c == name {
			return i
		}
	}
	return -1
}

// create makes n, a protected ephemeral sequential node holding id under
// its latch, and returns its stat. A create whose reply is lost (the
// connection failed mid-request) may have happened or not: create then
// lists the latch's children for n's protected prefix, as Curator does, so
// that a node made for us is found rather than left behind. If ctx ends
// first, the node is deleted in the background once the create's outcome
// is known.
func (b *Backend) create(ctx context.Context, s *session, sl *renew.Slot, name string, n *node, id string) (*zk.Stat, error) {
	b.track(n)
	for attempt := 0; ; attempt++ {
		type created struct {
			path string
			err  error
		}
		done := make(chan created, 1)
		if !b.goCall(func() {
			p, err := b.conn.Create(n.latch+"/"+n.prefix+lockName, []byte(id), zk.FlagEphemeralSequential, b.acl)
			if err == nil && b.isClosed() && !b.owned {
				// Close has deleted what it knew of; this one landed after.
				_ = b.conn.Delete(p, -1)
			}
			done <- created{p, err}
		}) {
			b.forget(n)
			return nil, baton.ErrClosed
		}
		var r created
		select {
		case r = <-done:
		case <-ctx.Done():
			b.cleanLater(sl, name, n, func() { <-done })
			return nil, ctx.Err()
		case <-b.ctx.Done():
			// Closed: like call, do not wait for a reply that a caller's
			// connection, cut off, may not bring for several session
			// timeouts. The node is Close's: it deleted what it found, the
			// goroutine above deletes one that lands later, and a Backend
			// from Dial closed the session.
			return nil, baton.ErrClosed
		}
		switch {
		case r.err == nil:
			b.setPath(n, r.path)
		case errors.Is(r.err, zk.ErrNoNode) && attempt < 3:
			// The latch path is missing: make it, as Curator's
			// creatingParentContainersIfNeeded does, and try again. The
			// server may delete an empty container between the two, so
			// more than once.
			if err := b.ensurePath(ctx, s, n.latch); err != nil {
				b.forget(n)
				return nil, err
			}
			continue
		case definite(r.err):
			b.forget(n)
			return nil, r.err
		default:
			b.log.Debug("create's outcome unknown; looking for the node", "latch", n.latch, "prefix", n.prefix, "err", r.err)
			found, err := b.find(ctx, s, n)
			if err != nil {
				b.dropNode(sl, name, n)
				return nil, fmt.Errorf("%w (looking for the node after: %w)", r.err, err)
			}
			if !found {
				b.forget(n)
				return nil, r.err
			}
			b.log.Info("found the latch node of a create whose reply was lost", "node", b.nodePath(n))
		}
		stat, err := retry(ctx, b, s, func() (*zk.Stat, error) {
			ok, st, err := b.conn.Exists(b.nodePath(n))
			if err == nil && !ok {
				err = zk.ErrNoNode
			}
			return st, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			// Gone as soon as made: the session ended, or an operator
			// was quick.
			b.forget(n)
			if b.conn.SessionID() != s.id {
				return nil, zk.ErrSessionExpired
			}
			return nil, fmt.Errorf("%w: latch node %s was deleted as soon as it was made", baton.ErrLeaseLost, b.nodePath(n))
		}
		if err != nil {
			b.dropNode(sl, name, n)
			return nil, err
		}
		return stat, nil
	}
}

// definite reports whether a create that failed with err certainly made no
// node.
func definite(err error) bool {
	for _, e := range []error{zk.ErrNoNode, zk.ErrNoAuth, zk.ErrNodeExists, zk.ErrInvalidACL,
		zk.ErrBadArguments, zk.ErrInvalidPath, zk.ErrNoChildrenForEphemerals, zk.ErrSessionExpired, zk.ErrAuthFailed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// find looks for n among its latch's children by its protected prefix and
// records its path if found. A sync first makes the server we are on catch
// up with the ensemble's leader, in case the create went to another server.
func (b *Backend) find(ctx context.Context, s *session, n *node) (bool, error) {
	children, err := retry(ctx, b, s, func() ([]string, error) {
		if _, err := b.conn.Sync(n.latch); err != nil {
			return nil, err
		}
		c, _, err := b.conn.Children(n.latch)
		return c, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if c := findProtected(children, n.prefix); c != "" {
		b.setPath(n, n.latch+"/"+c)
		return true, nil
	}
	return false, nil
}

// ensurePath creates the missing nodes of path as container nodes, which
// ZooKeeper deletes once their last child is gone.
func (b *Backend) ensurePath(ctx context.Context, s *session, path string) error {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	_, err := retry(ctx, b, s, func() (struct{}, error) {
		p := ""
		for _, seg := range segs {
			p += "/" + seg
			_, err := b.conn.CreateContainer(p, nil, zk.FlagContainer, b.acl)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return struct{}{}, fmt.Errorf("create %s: %w", p, err)
			}
		}
		return struct{}{}, nil
	})
	return err
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

func (b *Backend) track(n *node) {
	b.mu.Lock()
	b.nodes[n] = struct{}{}
	b.mu.Unlock()
}

// forget stops tracking n, which is known to be gone or never made.
func (b *Backend) forget(n *node) {
	b.mu.Lock()
	delete(b.nodes, n)
	b.mu.Unlock()
}

func (b *Backend) setPath(n *node, path string) {
	b.mu.Lock()
	n.path = path
	b.mu.Unlock()
}

func (b *Backend) nodePath(n *node) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return n.path
}

// deleteNode deletes n if it exists, and stops tracking it once it is known
// to be gone. A node whose path is unknown is looked for by its prefix. It
// tries the delete once: its callers retry in their own ways.
func (b *Backend) deleteNode(ctx context.Context, n *node) error {
	path := b.nodePath(n)
	if path == "" {
		found, err := b.find(ctx, nil, n)
		if err != nil {
			return err
		}
		if !found {
			b.forget(n)
			return nil
		}
		path = b.nodePath(n)
	}
	// The path carries our random UUID, so whatever is there is ours: no
	// version or czxid check is needed.
	_, err := call(ctx, b, func() (struct{}, error) { return struct{}{}, b.conn.Delete(path, -1) })
	if err == nil || errors.Is(err, zk.ErrNoNode) {
		b.forget(n)
		return nil
	}
	return err
}

// dropNode deletes a campaign's node once, bounded by RenewInterval, and
// keeps trying in the background if that fails. The caller's context may
// have ended already, which is often why the node must go.
func (b *Backend) dropNode(sl *renew.Slot, name string, n *node) {
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.RenewInterval)
	err := b.deleteNode(ctx, n)
	cancel()
	if err != nil {
		b.log.Warn("could not delete an abandoned campaign's latch node; retrying in the background",
			"lease", name, "latch", n.latch, "prefix", n.prefix, "err", err)
		b.cleanLater(sl, name, n, nil)
	}
}

// cleanLater deletes n in the background, after wait (if not nil) returns,
// retrying every RenewInterval until it succeeds or the Backend closes
// (Close deletes what is left, or closes the session). While it runs it
// keeps sl, if sl is still the name's slot, so that a new campaign for the
// name cannot start before the old node is gone.
func (b *Backend) cleanLater(sl *renew.Slot, name string, n *node, wait func()) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	done, _ := b.slots.CleaningLocked(sl)
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		defer done()
		if wait != nil {
			waited := make(chan struct{})
			go func() { wait(); close(waited) }()
			select {
			case <-waited:
			case <-b.ctx.Done():
				return
			}
		}
		for {
			ctx, cancel := context.WithTimeout(b.ctx, b.cfg.RenewInterval)
			err := b.deleteNode(ctx, n)
			cancel()
			if err == nil {
				b.log.Debug("deleted a left-over latch node", "lease", name, "latch", n.latch, "prefix", n.prefix)
				return
			}
			b.log.Debug("left-over latch node not deleted yet", "lease", name, "latch", n.latch, "prefix", n.prefix, "err", err)
			select {
			case <-b.ctx.Done():
				return
			case <-time.After(b.cfg.RenewInterval):
			}
		}
	}()
}

// campaignErr turns err into Campaign's error (see renew.CampaignErr).
func (b *Backend) campaignErr(ctx context.Context, s *session, name, what string, err error) error {
	return renew.CampaignErr(ctx, b.isClosed(), s.Terms, name, what, err)
}

func (b *Backend) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %w", baton.ErrBackendUnavailable, what, err)
}

// held is a lease this Backend holds.
type held struct {
	name  string
	n     *node
	path  string
	czxid int64
	sl    *renew.Slot
	s     *session
	term  *backend.BasicTerm
	ctx   context.Context
	stop  context.CancelFunc // stops watching the node

	mu       sync.Mutex
	released bool // Resign took over the node's deletion
	gone     bool // lose ended the term: the node is known to be gone
}

// hold starts the term of node n.
func (b *Backend) hold(s *session, sl *renew.Slot, name string, n *node, czxid int64, ep uint64) (baton.Term, error) {
	ctx, stop := context.WithCancel(s.ctx)
	h := &held{name: name, n: n, path: b.nodePath(n), czxid: czxid, sl: sl, s: s, ctx: ctx, stop: stop}
	// b.mu and the session's lock together make registering the term and
	// starting its watcher atomic with respect to Close and to the session
	// ending: either they see the term and end it, or we see them and give
	// up.
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		stop()
		return nil, baton.ErrClosed // Close deletes the node, or closes the session
	}
	token := epoch.Token(ep, uint64(czxid))
	t, ok := s.Start(name, token, func(ctx context.Context) error {
		return b.release(ctx, h)
	})
	if !ok {
		b.mu.Unlock()
		stop()
		// The session may still be alive on the server, holding our node.
		b.dropNode(sl, name, n)
		return nil, fmt.Errorf("%w: lease %q: ZooKeeper session 0x%x ended, or reached its safe-until, as the lease was won",
			baton.ErrBackendUnavailable, name, s.id)
	}
	h.term = t
	b.slots.WonLocked(sl, t)
	b.wg.Add(1)
	b.mu.Unlock()
	go b.watchHeld(h)
	b.log.Debug("acquired", "lease", name, "token", token, "czxid", czxid, "node", h.path, "session", fmt.Sprintf("0x%x", s.id))
	return &term{BasicTerm: t, b: b, h: h}, nil
}

// lose ends h's term with baton.ErrLeaseLost, its node being gone, and
// frees the lease name. watchHeld calls it when it sees the node go, and
// StoreState when the store refused a write because the node was gone.
func (b *Backend) lose(h *held, why string) {
	h.mu.Lock()
	h.gone = true
	h.mu.Unlock()
	h.s.Forget(h.term)
	if h.term.End(fmt.Errorf("%w: lease %q: latch node %s %s", baton.ErrLeaseLost, h.name, h.path, why)) {
		b.log.Info("lease lost", "lease", h.name, "token", h.czxid, "why", why)
	}
	b.forget(h.n)
	b.slots.Unclaim(h.sl)
	h.stop()
}

// watchHeld ends h's term when its node is deleted. It returns when the
// term was released or lost, or ended otherwise: its session generation
// ended at safe-until, or the term's own timer ended it there. In those
// last cases the node may outlive the term (the session may still be
// alive on the server, or come back), so it is deleted in the background.
func (b *Backend) watchHeld(h *held) {
	defer b.wg.Done()
	defer h.stop()
	lost := func(why string) { b.lose(h, why) }
	const deleted = "was deleted (by an operator, or by ZooKeeper expiring the session)"
	for h.ctx.Err() == nil && h.term.Err() == nil {
		type watched struct {
			stat *zk.Stat
			ch   <-chan zk.Event
		}
		// While the client is cut off this waits for it to come back (or
		// the generation to end): the node cannot be deleted before.
		w, err := call(h.ctx, b, func() (watched, error) {
			_, st, ch, err := b.conn.GetW(h.path)
			return watched{st, ch}, err
		})
		switch {
		case h.ctx.Err() != nil:
		case errors.Is(err, zk.ErrNoNode):
			lost(deleted)
			return
		case errors.Is(err, zk.ErrSessionExpired):
			lost("went with its expired session")
			return
		case err != nil:
			// The client failed the request while reconnecting; it sets
			// its watches again once back.
			select {
			case <-h.ctx.Done():
			case <-h.term.Done():
			case <-time.After(b.cfg.RenewInterval / 4):
			}
		case w.stat.Czxid != h.czxid:
			lost("was replaced by another node")
			return
		default:
			select {
			case ev := <-w.ch:
				switch {
				case ev.Type == zk.EventNodeDeleted:
					lost(deleted)
					return
				case ev.Type == zk.EventNotWatching && errors.Is(ev.Err, zk.ErrSessionExpired):
					lost("went with its expired session")
					return
				}
				// Its data changed, or the client closed: look again.
			case <-h.ctx.Done():
			case <-h.term.Done():
			}
		}
	}
	h.mu.Lock()
	// Resign ends the term before it calls release, so the term's error
	// may say so first.
	released := h.released || errors.Is(h.term.Err(), baton.ErrResigned)
	gone := h.gone
	h.mu.Unlock()
	switch {
	case gone:
		// StoreState found the node gone, and lose did the rest.
	case released:
		// release deletes the node.
	case b.isClosed():
		// Close deletes the node, or closes the session.
		b.slots.Unclaim(h.sl)
	default:
		// The term reached its safe-until without a confirmed renewal.
		// The session may live on on the server, and our node with it:
		// left alone it would keep the lease from every other candidate.
		h.s.Forget(h.term)
		b.cleanLater(h.sl, h.name, h.n, nil)
	}
}

// release is the term's release function: it deletes h's node.
func (b *Backend) release(ctx context.Context, h *held) error {
	h.mu.Lock()
	h.released = true
	h.mu.Unlock()
	h.stop()
	h.s.Forget(h.term)
	if err := b.deleteNode(ctx, h.n); err != nil {
		// Our session keeps the node alive: left alone, it would block
		// every other candidate for as long as the session lives.
		b.cleanLater(h.sl, h.name, h.n, nil)
		return fmt.Errorf("%w: release lease %q (retrying in the background): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	b.log.Debug("released", "lease", h.name, "token", h.czxid)
	b.slots.Unclaim(h.sl)
	return nil
}

// Leader implements baton.Backend. It reports the candidate whose node
// sorts first under the latch path, as Curator's LeaderLatch.getLeader
// does, with the token of its term (see epochNode). Right after a holder stopped at its
// safe-until (cut off from ZooKeeper, say) that may still be the stopped
// holder, until ZooKeeper expires its session. Record.Since is always
// zero: a node's ctime is when its candidate began to wait, not to lead.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	if err := CheckName(name); err != nil {
		return baton.Record{}, err
	}
	if b.isClosed() {
		return baton.Record{}, baton.ErrClosed
	}
	latch := b.LatchPath(name)
	type leader struct {
		data []byte
		stat *zk.Stat
	}
	l, err := retry(ctx, b, nil, func() (*leader, error) {
		children, _, err := b.conn.Children(latch)
		if errors.Is(err, zk.ErrNoNode) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		sortChildren(children)
		for _, c := range children {
			data, stat, err := b.conn.Get(latch + "/" + c)
			if errors.Is(err, zk.ErrNoNode) {
				continue // left since the listing: the next one leads
			}
			if err != nil {
				return nil, err
			}
			return &leader{data, stat}, nil
		}
		return nil, nil
	})
	if err != nil {
		return baton.Record{}, b.unavailable(ctx, "read latch "+latch, err)
	}
	if l == nil {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	// Read after the latch node, so an epoch created meanwhile (ZooKeeper
	// wiped in between) makes the token too high, never too low. None: a
	// Curator holder where baton never campaigned, with the bare czxid.
	ep, err := b.readEpoch(ctx, nil, false)
	if err != nil {
		return baton.Record{}, b.unavailable(ctx, "read epoch node "+b.EpochPath(), err)
	}
	return baton.Record{Lease: name, Holder: string(l.data), Token: epoch.Token(ep, uint64(l.stat.Czxid))}, nil
}

// Close ends every term this Backend holds (Err wraps baton.ErrClosed) and
// gives its nodes up so that standbys take over at once: a Backend from
// Dial closes its session, which makes the server delete them; one from New
// deletes them one by one, within ctx, and returns the error if it cannot
// (they then go when the caller's session ends). It waits for the
// goroutines it started; requests it sent on a caller's connection that is
// cut off may still wait for their replies after Close returns, and change
// nothing when they come. Later calls of Campaign and Leader return
// baton.ErrClosed; a second Close returns nil.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.wg.Wait()
		return nil
	}
	b.closed = true
	s := b.sess
	b.sess = nil
	nodes := make([]*node, 0, len(b.nodes))
	for n := range b.nodes {
		nodes = append(nodes, n)
	}
	b.mu.Unlock()
	if s != nil {
		b.endSession(s, fmt.Errorf("%w: ZooKeeper session 0x%x closed", baton.ErrClosed, s.id))
	}
	var errs []error
	if b.owned {
		b.conn.Close()
	} else {
		for _, n := range nodes {
			err := b.deleteNode(ctx, n)
			for err != nil && transient(err) && ctx.Err() == nil {
				select {
				case <-ctx.Done():
				case <-time.After(retryPause):
					err = b.deleteNode(ctx, n)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("zookeeper: delete latch node under %s (it goes when the session ends): %w", n.latch, err))
			}
		}
	}
	b.cancel()
	b.wg.Wait()
	if b.owned {
		b.callMu.Lock()
		b.callsDone = true
		b.callMu.Unlock()
		b.calls.Wait() // the closed client fails whatever was pending
	}
	return errors.Join(errs...)
}
