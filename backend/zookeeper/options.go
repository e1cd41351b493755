package zookeeper

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// DefaultRoot is the parent of the latch paths when Options.Root is empty.
const DefaultRoot = "/baton"

// Options configures a Backend. The zero value means the documented defaults.
type Options struct {
	backend.
		// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s,
		// TTL/6, TTL/10; RenewInterval is shorter than elsewhere because a
		// renewal confirms less on an ensemble: see ensembleLag). Left at
		// zero, RenewInterval is a third of the session timeout on a
		// standalone server instead, where renewals ride on the client's
		// own pings and send nothing more (see SessionProbe). TTL is the
		// ZooKeeper session timeout that Dial asks for; the server grants
		// it clamped into [minSessionTimeout, maxSessionTimeout] (by
		// default 2 to 20 of its ticks), and the Backend then times
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

	// Watches, if the caller's connection hands its events to its Callback
	// (zk.WithEventCallback(watches.Callback) in zk.Connect), is how the
	// Backend learns that the latch node of a lease it holds was deleted
	// or replaced, or went with the expired session: from the client's
	// event delivery, with no goroutine per held lease. Nil means a
	// goroutine per held lease waits for its node's watch instead. A
	// Watches that the connection has never called fails campaigns with
	// baton.ErrBackendUnavailable rather than miss a lost lease; one
	// serves one Backend. Dial always sets it.
	Watches *Watches

	// Logger receives log lines (group "zookeeper"). Nil (the default)
	// means silent.
	Logger *slog.Logger
}

// DialOptions configures Dial. The zero value means the documented defaults.
type DialOptions struct {
	// Options configures the Backend; Probe and Watches are ignored, as
	// Dial makes its own.
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

// Validate reports every problem with o at once, as a *baton.ConfigError,
// or nil: what New and Dial would refuse, checked without a connection
// (for a CLI, say, to report a usage error before it dials).
func (o Options) Validate() error {
	_, _, _, err := o.validate()
	return err
}

// ensembleLag is how long before a confirmed renewal was sent the
// ZooKeeper leader, which expires sessions, may last have heard from the
// client, for a session timeout of timeout and renewals every interval. A
// client connected to a follower is heard by the leader only through the
// follower's replies to the leader's pings, every half tick; should the
// follower lose the leader just after it answered a renewal, the leader's
// last word of the client may be the request before it: up to interval
// earlier (renewals are never further apart), plus half a tick. The tick
// is the server's and unknown here, but a negotiated timeout is at least
// minSessionTimeout, 2 ticks by default, so half a tick is at most
// timeout/4. Safe-until is measured from the renewal's send time minus
// this lag. A standalone server, which expires sessions itself, has no lag
// (see SessionProbe).
func ensembleLag(interval, timeout time.Duration) time.Duration {
	return timeout/4 + interval
}

// safeWindow is how far ahead of a renewal's next due time safe-until
// stays on an ensemble while renewals are confirmed at once, for a session
// timeout of timeout: the renewal window that `baton run --grace` must fit
// in. A standalone server leaves more (see RenewalWindow).
func safeWindow(cfg backend.Config, timeout time.Duration) time.Duration {
	return timeout - ensembleLag(cfg.RenewInterval, timeout) - cfg.DriftMargin - cfg.RenewInterval
}

// RenewalWindow returns how far ahead safe-until stays, at worst, while
// renewals are healthy, if the server grants the TTL asked for: the TTL
// less the ensemble lag (TTL/4 + RenewInterval, see the package doc), the
// drift margin and one renew interval; a standalone server leaves more.
// A holder's work must be able to stop
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
