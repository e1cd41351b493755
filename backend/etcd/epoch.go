package etcd

import (
	"context"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// epochSuffix follows the lease name in the key of the lease's epoch. Like
// stateSuffix it holds no "/", so the key never falls under an election's
// key prefix (NAME + "/"), and it differs from every state key, which ends
// in stateSuffix.
const epochSuffix = "!epoch"

// epochKey is the key of lease name's epoch: Prefix + name + "!epoch".
//
// etcd's revisions start again at 1 when etcd loses its data (a member
// restarted with a wiped data directory, a cluster restored from nothing),
// and so would tokens made of create revisions alone. The epoch key holds
// the wall-clock second at which it was written (backend.EpochOf),
// put only if absent, so it lives as long as etcd's data; tokens are
// epoch<<32 + the create revision of the holder's key, read together in one
// transaction.
func (b *Backend) epochKey(name string) string { return b.prefix + name + epochSuffix }

// createEpoch puts lease name's epoch key unless it exists.
func (b *Backend) createEpoch(ctx context.Context, name string) error {
	ekey := b.epochKey(name)
	e := b.epochs.Next(name, b.now())
	resp, err := b.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(ekey), "=", 0)).
		Then(clientv3.OpPut(ekey, backend.FormatEpoch(e))).
		Commit()
	if err != nil {
		return err
	}
	if resp.Succeeded {
		b.log.Info("wrote the lease's epoch: etcd had none (a first campaign, or etcd lost its data)", "lease", name, "key", ekey, "epoch", backend.FormatEpoch(e))
	}
	return nil
}

// sawEpoch parses an epoch key as read (kvs holds it, or nothing), and logs
// a change from the epoch this Backend saw last: etcd lost its data.
func (b *Backend) sawEpoch(name string, kvs []*mvccpb.KeyValue) (uint64, error) {
	if len(kvs) == 0 {
		return 0, nil
	}
	key := string(kvs[0].Key)
	e, err := b.epochs.Check(b.log, backend.EpochLocation{Store: "etcd", Counter: "revisions", Lease: name,
		Kind: "key", Key: key, Delete: "etcdctl del " + key}, string(kvs[0].Value))
	if err != nil {
		return 0, fmt.Errorf("%w: etcd: %w", baton.ErrBackendUnavailable, err)
	}
	return e, nil
}
