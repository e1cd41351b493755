package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// Campaign implements baton.Backend. The Backend's candidates for one name
// take turns, first come, first served, as on etcd: one has a latch node,
// the others wait in the process, and each creates its node (at the back of
// the latch) when its turn comes, so ZooKeeper sees one node and one watch
// per Backend. A second Campaign by a candidate that already campaigns for
// or holds the name returns an error wrapping baton.ErrAlreadyCampaigning.
// The term it returns implements baton.StateTerm: its state lives at
// StatePath(name).
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if c.ID == "" {
		return nil, fmt.Errorf("zookeeper: candidate ID must not be empty (lease %q)", name)
	}
	return b.sessions.Campaign(ctx, name, c.ID, func(sl *backend.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

func (b *Backend) campaign(ctx context.Context, sl *backend.Slot, name, id string) (baton.Term, error) {
	latch := b.LatchPath(name)
	s, n, czxid, ep, err := b.enter(ctx, sl, name, latch, id)
	if err != nil {
		return nil, err
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
		case <-s.Context().Done():
			b.dropNode(sl, name, n)
			return nil, b.campaignErr(ctx, s, name, "wait for "+pred, s.Err())
		}
	}
}

// enter makes this campaign's latch node under latch, on the live session
// generation, and returns the generation, the node, its czxid and the
// lease's epoch, read after it.
func (b *Backend) enter(ctx context.Context, sl *backend.Slot, name, latch, id string) (*sess, *node, int64, uint64, error) {
	for retried := false; ; retried = true {
		s, err := b.sessions.Session(ctx)
		if err != nil {
			return nil, nil, 0, 0, err
		}
		n := &node{latch: latch, prefix: newProtectedPrefix()}
		stat, err := b.create(ctx, s, sl, name, n, id)
		if err == nil && stat.EphemeralOwner == s.ID.id {
			// Read after the node is made on s, and checked to be read on
			// s: both come from one incarnation of ZooKeeper's data.
			var ep uint64
			if ep, err = b.readEpoch(ctx, s, true); err == nil {
				return s, n, stat.Czxid, ep, nil
			}
			b.dropNode(sl, name, n)
		}
		if err == nil {
			// The create ran on a newer session: the client found ours
			// expired and made another before our renewals noticed.
			b.dropNode(sl, name, n)
			b.sessions.Lost(s)
			err = zk.ErrSessionExpired
		}
		if errors.Is(err, zk.ErrSessionExpired) && !retried {
			b.sessions.Lost(s)
			continue
		}
		if errors.Is(err, baton.ErrLeaseLost) && ctx.Err() == nil {
			return nil, nil, 0, 0, err
		}
		return nil, nil, 0, 0, b.campaignErr(ctx, s, name, "create latch node under "+latch, err)
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
func (b *Backend) create(ctx context.Context, s *sess, sl *backend.Slot, name string, n *node, id string) (*zk.Stat, error) {
	b.track(n)
	for attempt := 0; ; attempt++ {
		path, err := b.createOnce(ctx, sl, name, n, id)
		switch {
		case errors.Is(err, baton.ErrClosed), errors.Is(err, ctx.Err()) && ctx.Err() != nil:
			return nil, err
		case err == nil:
			b.setPath(n, path)
		case errors.Is(err, zk.ErrNoNode) && attempt < 3:
			// The latch path is missing: make it, as Curator's
			// creatingParentContainersIfNeeded does, and try again. The
			// server may delete an empty container between the two, so
			// more than once.
			if err := b.ensurePath(ctx, s, n.latch); err != nil {
				b.forget(n)
				return nil, err
			}
			continue
		case definite(err):
			b.forget(n)
			return nil, err
		default:
			b.log.Debug("create's outcome unknown; looking for the node", "latch", n.latch, "prefix", n.prefix, "err", err)
			found, ferr := b.find(ctx, s, n)
			if ferr != nil {
				b.dropNode(sl, name, n)
				return nil, fmt.Errorf("%w (looking for the node after: %w)", err, ferr)
			}
			if !found {
				b.forget(n)
				return nil, err
			}
			b.log.Info("found the latch node of a create whose reply was lost", "node", b.nodePath(n))
		}
		return b.statNode(ctx, s, sl, name, n)
	}
}

// createOnce sends n's create once and returns the path made, or the
// create's error; ErrClosed once the Backend closed, and ctx.Err() once
// ctx ended (the node is then deleted in the background once the create's
// outcome is known).
func (b *Backend) createOnce(ctx context.Context, sl *backend.Slot, name string, n *node, id string) (string, error) {
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
		return "", baton.ErrClosed
	}
	select {
	case r := <-done:
		return r.path, r.err
	case <-ctx.Done():
		b.cleanLater(sl, name, n, func() { <-done })
		return "", ctx.Err()
	case <-b.ctx.Done():
		// Closed: like call, do not wait for a reply that a caller's
		// connection, cut off, may not bring for several session
		// timeouts. The node is Close's: it deleted what it found, the
		// goroutine above deletes one that lands later, and a Backend
		// from Dial closed the session.
		return "", baton.ErrClosed
	}
}

// statNode returns the stat of n, just made on s.
func (b *Backend) statNode(ctx context.Context, s *sess, sl *backend.Slot, name string, n *node) (*zk.Stat, error) {
	stat, err := retry(ctx, b, s, func() (*zk.Stat, error) {
		ok, st, err := b.conn.Exists(b.nodePath(n))
		if err == nil && !ok {
			err = zk.ErrNoNode
		}
		return st, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		// Gone as soon as made: the session ended, or an operator was
		// quick.
		b.forget(n)
		if b.conn.SessionID() != s.ID.id {
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
func (b *Backend) find(ctx context.Context, s *sess, n *node) (bool, error) {
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
func (b *Backend) ensurePath(ctx context.Context, s *sess, path string) error {
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

// campaignErr turns err into Campaign's error (see
// backend.SessionManager.CampaignErr).
func (b *Backend) campaignErr(ctx context.Context, s *sess, name, what string, err error) error {
	return b.sessions.CampaignErr(ctx, s, name, what, err)
}

func (b *Backend) unavailable(ctx context.Context, what string, err error) error {
	return backend.Unavailable(ctx, what, err)
}
