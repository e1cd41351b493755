package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

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
	// watches, from Options, hands the connection's events to watch;
	// watch follows the latch nodes of the leases held.
	watches *Watches
	watch   *heldWatch
	// ridePings says RenewInterval was left at its default, so that on a
	// standalone server renewals ride on the client's pings (see Renew).
	ridePings bool

	// ctx bounds the Backend's background work (sessions.Context()); Close
	// cancels it.
	ctx context.Context

	// calls counts the goroutines waiting for the client's replies (see
	// call); once callsDone is set, under callMu, no more start, so that
	// Close can wait for them.
	calls     sync.WaitGroup
	callMu    sync.Mutex
	callsDone bool

	// sessions owns the session generations, the goroutines and the lease
	// names this Backend campaigns for or holds, so that one Backend has
	// at most one latch node per name (see the etcd backend). While a node
	// of a name is being deleted in the background, the name stays
	// claimed.
	sessions *backend.SessionManager[*gen]

	nmu   sync.Mutex
	nodes map[*node]struct{} // every node made, or maybe made, and not known to be gone; guarded by nmu

	// epochs follows the epoch node as read (see epochNode).
	epochs backend.EpochTracker
	// now is the wall clock an epoch created is taken from.
	now func() time.Time
}

var _ baton.Backend = (*Backend)(nil)

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
	b := &Backend{
		conn:    conn,
		cfg:     cfg,
		root:    root,
		acl:     acl,
		probe:   opts.Probe,
		log:     log.WithGroup("zookeeper"),
		watches: opts.Watches,
		// A probe is what sees the pings answered.
		ridePings: opts.Probe != nil && opts.Config.RenewInterval == 0,
		nodes:     map[*node]struct{}{},
		now:       time.Now,
	}
	b.watch = newHeldWatch(b, b.watches != nil)
	if b.watches != nil && !b.watches.attach(b.watch) {
		return nil, &baton.ConfigError{Problems: []string{"zookeeper: Options.Watches serves another Backend already: make one per connection with NewWatches"}}
	}
	b.sessions = newSessions(b)
	b.ctx = b.sessions.Context()
	if b.watches != nil {
		b.sessions.Go(b.watch.run)
	}
	return b, nil
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

func (b *Backend) isClosed() bool { return b.sessions.Closed() }

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
	rec, _, err := b.leader(ctx, name, false)
	return rec, err
}

// leader is Leader for a checked name. With watch, it also returns a
// channel that receives an event when the latch's children change (or,
// when the latch path does not exist, when it is created).
func (b *Backend) leader(ctx context.Context, name string, watch bool) (baton.Record, <-chan zk.Event, error) {
	if b.isClosed() {
		return baton.Record{}, nil, baton.ErrClosed
	}
	latch := b.LatchPath(name)
	type leader struct {
		data  []byte
		stat  *zk.Stat
		watch <-chan zk.Event
	}
	l, err := retry(ctx, b, nil, func() (*leader, error) {
		var (
			children []string
			ch       <-chan zk.Event
			err      error
		)
		for {
			if !watch {
				children, _, err = b.conn.Children(latch)
				break
			}
			children, _, ch, err = b.conn.ChildrenW(latch)
			if !errors.Is(err, zk.ErrNoNode) {
				break
			}
			var ok bool
			if ok, _, ch, err = b.conn.ExistsW(latch); err != nil || !ok {
				return &leader{watch: ch}, err
			}
			// Created since: list it.
		}
		if errors.Is(err, zk.ErrNoNode) {
			return &leader{}, nil
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
			return &leader{data, stat, ch}, nil
		}
		return &leader{watch: ch}, nil
	})
	if err != nil {
		return baton.Record{}, nil, b.unavailable(ctx, "read latch "+latch, err)
	}
	if l.stat == nil {
		return baton.Record{}, l.watch, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	// Read after the latch node, so an epoch created meanwhile (ZooKeeper
	// wiped in between) makes the token too high, never too low. None: a
	// Curator holder where baton never campaigned, with the bare czxid.
	ep, err := b.readEpoch(ctx, nil, false)
	if err != nil {
		return baton.Record{}, nil, b.unavailable(ctx, "read epoch node "+b.EpochPath(), err)
	}
	return baton.Record{Lease: name, Holder: string(l.data), Token: backend.EpochToken(ep, uint64(l.stat.Czxid))}, l.watch, nil
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
	first := false
	err := b.sessions.Close(ctx, func(*sess) error {
		first = true
		if b.owned {
			b.conn.Close()
			return nil
		}
		return b.deleteNodes(ctx)
	})
	if b.watches != nil {
		b.watches.detach(b.watch)
	}
	if first && b.owned {
		b.callMu.Lock()
		b.callsDone = true
		b.callMu.Unlock()
		b.calls.Wait() // the closed client fails whatever was pending
	}
	return err
}
