package zookeeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// epochNode is the child of Root that holds the epoch of ZooKeeper's data.
// Like stateDir it is a sibling of the latch paths, never one of them nor
// under one, so Curator's LeaderLatch never sees it: CheckName refuses it
// as a lease name and checkRoot as a segment of Root.
//
// ZooKeeper's zxids start again from the bottom when it loses its data (a
// wiped data directory, an ensemble rebuilt), and so would tokens made of
// czxids alone. The epoch node is a persistent node holding the wall-clock
// second at which it was created (backend.EpochOf); it is created
// only if absent, so it lives as long as ZooKeeper's data, and tokens are
// epoch<<32 + the czxid of the holder's latch node. Not a container: those
// are reaped once empty, and the Root's container is kept by it.
const epochNode = ".baton-epoch"

// EpochPath returns the path of the epoch node: Root + "/.baton-epoch".
func (b *Backend) EpochPath() string {
	if b.root == "/" {
		return "/" + epochNode
	}
	return b.root + "/" + epochNode
}

// readEpoch returns the epoch of ZooKeeper's data, creating the epoch node
// if it is missing and create is set (0 if it is missing and not). With s not nil, it fails with zk.ErrSessionExpired
// unless the read ran on s: a session lives in one incarnation of
// ZooKeeper's data, so the epoch read is the one of s's latch nodes.
func (b *Backend) readEpoch(ctx context.Context, s *sess, create bool) (uint64, error) {
	p := b.EpochPath()
	for range 4 {
		data, err := retry(ctx, b, s, func() ([]byte, error) {
			data, _, err := b.conn.Get(p)
			return data, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			if !create {
				return 0, nil
			}
			if err := b.createEpoch(ctx, s); err != nil {
				return 0, err
			}
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read epoch node %s: %w", p, err)
		}
		if s != nil && b.conn.SessionID() != s.ID.id {
			return 0, zk.ErrSessionExpired
		}
		e, err := b.epochs.Check(b.log, backend.EpochLocation{Store: "ZooKeeper", Counter: "zxids", Kind: "node", Key: p}, string(data))
		if err != nil {
			return 0, fmt.Errorf("%w: zookeeper: %w", baton.ErrBackendUnavailable, err)
		}
		return e, nil
	}
	return 0, fmt.Errorf("zookeeper: epoch node %s keeps vanishing", p)
}

// createEpoch creates the epoch node (and Root) unless it exists.
func (b *Backend) createEpoch(ctx context.Context, s *sess) error {
	p := b.EpochPath()
	e := b.epochs.Next("", b.now())
	for range 3 {
		_, err := retry(ctx, b, s, func() (string, error) {
			return b.conn.Create(p, []byte(backend.FormatEpoch(e)), 0, b.acl)
		})
		switch {
		case err == nil:
			b.log.Info("created the epoch node: ZooKeeper had none (a first campaign, or ZooKeeper lost its data)", "node", p, "epoch", backend.FormatEpoch(e))
			return nil
		case errors.Is(err, zk.ErrNodeExists):
			return nil
		case errors.Is(err, zk.ErrNoNode) && b.root != "/":
			if err := b.ensurePath(ctx, s, b.root); err != nil {
				return err
			}
		default:
			return fmt.Errorf("create epoch node %s: %w", p, err)
		}
	}
	return fmt.Errorf("zookeeper: the parent of epoch node %s keeps vanishing", p)
}
