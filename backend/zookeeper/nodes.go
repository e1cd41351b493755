package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// node is a latch node this Backend made, or may have made: a create whose
// reply was lost is known only by its protected prefix until a listing of
// the latch's children finds it or proves it absent.
type node struct {
	latch  string // the latch path, the node's parent
	prefix string // "_c_<UUID>-": the node's name starts with it
	// path is the node's full path once known; guarded by Backend.nmu, as
	// Close reads it while a campaign may set it.
	path string
}

func (b *Backend) track(n *node) {
	b.nmu.Lock()
	b.nodes[n] = struct{}{}
	b.nmu.Unlock()
}

// forget stops tracking n, which is known to be gone or never made.
func (b *Backend) forget(n *node) {
	b.nmu.Lock()
	delete(b.nodes, n)
	b.nmu.Unlock()
}

func (b *Backend) setPath(n *node, path string) {
	b.nmu.Lock()
	n.path = path
	b.nmu.Unlock()
}

func (b *Backend) nodePath(n *node) string {
	b.nmu.Lock()
	defer b.nmu.Unlock()
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
func (b *Backend) dropNode(sl *backend.Slot, name string, n *node) {
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
func (b *Backend) cleanLater(sl *backend.Slot, name string, n *node, wait func()) {
	b.sessions.CleanLater(sl, func() {
		if wait != nil {
			waited := make(chan struct{})
			go func() { wait(); close(waited) }()
			select {
			case <-waited:
			case <-b.ctx.Done():
				return
			}
		}
		if backend.Retry(b.ctx, b.cfg.RenewInterval, b.cfg.RenewInterval, true, func(ctx context.Context) error {
			err := b.deleteNode(ctx, n)
			if err != nil {
				b.log.Debug("left-over latch node not deleted yet", "lease", name, "latch", n.latch, "prefix", n.prefix, "err", err)
			}
			return err
		}) {
			b.log.Debug("deleted a left-over latch node", "lease", name, "latch", n.latch, "prefix", n.prefix)
		}
	})
}

// deleteNodes deletes every node the Backend made, or may have made, and
// does not know to be gone, within ctx.
func (b *Backend) deleteNodes(ctx context.Context) error {
	b.nmu.Lock()
	nodes := make([]*node, 0, len(b.nodes))
	for n := range b.nodes {
		nodes = append(nodes, n)
	}
	b.nmu.Unlock()
	var errs []error
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
	return errors.Join(errs...)
}
