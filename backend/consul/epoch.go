package consul

import (
	"context"
	"fmt"
	"strings"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

// epochName is the key below a lease's prefix that holds the lease's
// epoch, beside the lock key and the state key. Like the state key it has
// no session, which `consul lock` in its semaphore mode ignores, and does
// not begin with ".lock", so a watch of the lock key does not cover it.
//
// Consul's raft indexes start again from the bottom when its servers lose
// their data (a wiped data directory, a -dev agent restarted), and so would
// tokens made of ModifyIndexes alone. The epoch key holds the wall-clock
// second at which it was written (backend.EpochOf), by a
// check-and-set on index 0, so it lives as long as Consul's data; tokens
// are epoch<<32 + the lock key's ModifyIndex, read in the transaction that
// locks it.
const epochName = ".baton-epoch"

// epochKey is the epoch key of the lease whose lock key is key: Prefix +
// NAME + "/.baton-epoch".
func epochKey(key string) string { return strings.TrimSuffix(key, lockKey) + epochName }

// EpochKey returns the key at which lease name keeps the epoch its tokens
// start from, Prefix + name + "/.baton-epoch", or the error Key would
// return for name. The Backend never deletes it.
func (b *Backend) EpochKey(name string) (string, error) {
	key, err := b.Key(name)
	if err != nil {
		return "", err
	}
	return epochKey(key), nil
}

// createEpoch writes lease name's epoch key ekey unless it exists.
func (b *Backend) createEpoch(ctx context.Context, name, ekey string) error {
	e := b.epochs.Next(name, b.now())
	_, ok, err := b.txn(ctx, api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: ekey, Index: 0, Value: []byte(backend.FormatEpoch(e))}}})
	if err != nil {
		return fmt.Errorf("write epoch key %s: %w", ekey, err)
	}
	if ok {
		b.log.Info("wrote the lease's epoch: Consul had none (a first campaign, or Consul lost its data)", "lease", name, "key", ekey, "epoch", backend.FormatEpoch(e))
	}
	return nil
}

// sawEpoch parses an epoch key as read (nil: absent, epoch 0), and logs a
// change from the epoch this Backend saw last: Consul lost its data.
func (b *Backend) sawEpoch(name string, p *api.KVPair) (uint64, error) {
	if p == nil {
		return 0, nil
	}
	e, err := b.epochs.Check(b.log, backend.EpochLocation{Store: "Consul", Counter: "indexes", Lease: name,
		Kind: "key", Key: p.Key, Delete: "consul kv delete " + p.Key}, string(p.Value))
	if err != nil {
		return 0, fmt.Errorf("%w: consul: %w", baton.ErrBackendUnavailable, err)
	}
	return e, nil
}
