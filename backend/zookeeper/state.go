package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// stateDir is the child of Root that holds the leases' state nodes. It is
// a sibling of the latch paths, never a child of one: Curator's LeaderLatch
// counts every child of a latch path as a participant. CheckName refuses it
// as a lease name and checkRoot as a segment of Root, so that no latch path
// of any Backend can be, contain, or lie inside the state tree.
const stateDir = ".baton-state"

// storeAttempts bounds how often StoreState switches between setting and
// creating the state node (or remaking its parent) when others keep
// creating and deleting it under it.
const storeAttempts = 8

// StatePath returns the path of lease name's state node: Root +
// "/.baton-state/" + name. It is a persistent node, made by the first
// StoreState of any term of the lease and kept after the terms end, so
// that the next holder finds it.
func (b *Backend) StatePath(name string) string {
	if b.root == "/" {
		return "/" + stateDir + "/" + name
	}
	return b.root + "/" + stateDir + "/" + name
}

// term is a term of a lease held on ZooKeeper: the BasicTerm that the
// session renews, and the lease's state (baton.StateTerm). It is safe for
// concurrent use.
type term struct {
	*backend.BasicTerm
	b *Backend
	h *held
}

var _ baton.StateTerm = (*term)(nil)

// LoadState implements baton.StateTerm: a sync, so that the server the
// client is connected to catches up with the ensemble's leader, then a read
// of the state node. It returns nil when the node does not exist, and works
// after the term ended too. Errors of the connection wrap
// baton.ErrBackendUnavailable.
func (t *term) LoadState(ctx context.Context) ([]byte, error) {
	b, p := t.b, t.b.StatePath(t.h.name)
	type got struct {
		data   []byte
		exists bool
	}
	g, err := retry(ctx, b, nil, func() (got, error) {
		// Without the sync a follower could answer from a copy older than
		// the last write the previous holder saw confirmed.
		if _, err := b.conn.Sync(p); err != nil {
			return got{}, err
		}
		data, _, err := b.conn.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			return got{}, nil
		}
		return got{data, err == nil}, err
	})
	switch {
	case err == nil && !g.exists:
		return nil, nil
	case err == nil && g.data == nil:
		return []byte{}, nil // stored empty, which is not "never stored"
	case err == nil:
		return g.data, nil
	case ctx.Err() != nil, transient(err), errors.Is(err, baton.ErrClosed):
		return nil, fmt.Errorf("%w: zookeeper: lease %q: read state %s: %w", baton.ErrBackendUnavailable, t.h.name, p, err)
	default:
		return nil, fmt.Errorf("zookeeper: lease %q: read state %s: %w", t.h.name, p, err)
	}
}

// StoreState implements baton.StateTerm with one multi that checks that
// the term's latch node exists and sets (or creates) the state node, so
// that ZooKeeper applies the write only while the term holds the lease.
// When the check fails, the term ends with baton.ErrLeaseLost and so does
// StoreState's error. A connection error, or ctx ending, wraps
// baton.ErrBackendUnavailable: the write may still land (fenced all the
// same, by the check), and LoadState tells.
func (t *term) StoreState(ctx context.Context, value []byte) error {
	return backend.StoreState(ctx, t, value, t.store)
}

// store is StoreState once the term was found running: the store alone
// decides from here on.
func (t *term) store(ctx context.Context, value []byte) error {
	b, h := t.b, t.h
	p := b.StatePath(h.name)
	if value == nil {
		value = []byte{}
	}
	// Why "our latch node exists" is "we hold the lease": the node came
	// first among the latch's children when the term began (that is how it
	// began), and a node that comes first stays first for as long as it
	// exists. ZooKeeper numbers a parent's sequential children in the
	// order it creates them, so every node made after ours sorts after it;
	// and the latch path, a container, cannot be deleted and remade (which
	// would restart the numbering) while our node is in it. Only a node
	// that an operator makes by hand, with a name that does not follow
	// the latch's pattern, could sort before ours; the term's watch does
	// not count such nodes either (see heldWatch). The node's name holds
	// our random protected prefix, so no other candidate's node can have
	// its path, and an ephemeral node goes with its session: when the
	// server expired the session, the check fails too.
	check := &zk.CheckVersionRequest{Path: h.path, Version: -1}
	create := false
	for range storeAttempts {
		var write any = &zk.SetDataRequest{Path: p, Data: value, Version: -1}
		if create {
			write = &zk.CreateRequest{Path: p, Data: value, Acl: b.acl, Flags: 0}
		}
		failed, err := b.multi(ctx, t.Done(), check, write)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errUnsent):
			// The term ended while the client had no connection for the
			// request: nothing was sent, and nothing will be.
			return backend.EndedError(t)
		case failed == 0 && errors.Is(err, zk.ErrNoNode),
			failed < 0 && errors.Is(err, zk.ErrSessionExpired):
			why := "was deleted (by an operator, or by ZooKeeper expiring the session)"
			if failed < 0 {
				why = "went with its expired session"
			}
			b.lose(h, why)
			return fmt.Errorf("%w: zookeeper: lease %q (token %d): the store refused the state: latch node %s %s",
				baton.ErrLeaseLost, h.name, h.czxid, h.path, why)
		case failed == 1 && !create && errors.Is(err, zk.ErrNoNode):
			create = true // no term stored a state yet
		case failed == 1 && create && errors.Is(err, zk.ErrNodeExists):
			// The node was made between our set and our create. Not by
			// another term: the check passed with our set, and no other
			// term's check can pass while our node exists. So by a
			// concurrent StoreState of this term, or by hand: set it.
			create = false
		case failed == 1 && create && errors.Is(err, zk.ErrNoNode):
			// The state tree is missing, or was a container that the
			// server deleted once empty: make it, as for latch paths.
			if err := b.ensurePath(ctx, nil, path.Dir(p)); err != nil {
				return b.stateErr(ctx, h, p, err)
			}
		default:
			return b.stateErr(ctx, h, p, err)
		}
	}
	return fmt.Errorf("zookeeper: lease %q: state node %s kept being created and deleted by others; state not stored", h.name, p)
}

// errUnsent is multi's error when done closed before the request could be
// sent.
var errUnsent = errors.New("zookeeper: request not sent")

// multi sends ops as one multi request and returns the index of the op
// that failed with its error, or -1 and the request's error. It asks again
// only while the client reports that it never sent the request
// (zk.ErrNoServer), and gives up with errUnsent once done is closed: once
// sent, a request whose reply is lost may have been applied, and a second
// try could then fail its check only because the first one succeeded.
func (b *Backend) multi(ctx context.Context, done <-chan struct{}, ops ...any) (int, error) {
	for {
		res, err := call(ctx, b, func() ([]zk.MultiResponse, error) { return b.conn.Multi(ops...) })
		if err == nil {
			return -1, nil
		}
		for i, r := range res {
			if r.Error != nil {
				return i, r.Error
			}
		}
		if !errors.Is(err, zk.ErrNoServer) {
			return -1, err
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-b.ctx.Done():
			return -1, baton.ErrClosed
		case <-done:
			return -1, errUnsent
		case <-time.After(retryPause):
		}
	}
}

// stateErr is StoreState's error for err, with which the write to state
// node p failed without a verdict on the lease.
func (b *Backend) stateErr(ctx context.Context, h *held, p string, err error) error {
	if ctx.Err() != nil || transient(err) || errors.Is(err, baton.ErrClosed) || errors.Is(err, zk.ErrClosing) {
		return fmt.Errorf("%w: zookeeper: lease %q: store state %s (it may or may not have been stored): %w",
			baton.ErrBackendUnavailable, h.name, p, err)
	}
	return fmt.Errorf("zookeeper: lease %q: store state %s: %w", h.name, p, err)
}
