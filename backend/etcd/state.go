package etcd

import (
	"context"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stateSuffix follows the lease name in the key of the lease's state. It
// holds no "/", and lease names hold none either, so a state key never falls
// under any election's key prefix (NAME + "/"), never equals a candidate's
// key (which always holds a "/" after the Prefix), and differs for every
// lease name.
const stateSuffix = "!state"

// stateKey is the key of lease name's state: Prefix + name + "!state".
func (b *Backend) stateKey(name string) string { return b.prefix + name + stateSuffix }

// stateTerm is the Term of a lease this Backend holds: the BasicTerm the
// session extends, and the lease's state (baton.StateTerm). Safe for
// concurrent use.
type stateTerm struct {
	*backend.BasicTerm
	b *Backend
	h *held
}

var _ baton.StateTerm = (*stateTerm)(nil)

// LoadState implements baton.StateTerm: a linearizable read of the state
// key (clientv3's default), nil when it was never written. It works after
// the term ended, and after the Backend closed while the client is open.
func (t *stateTerm) LoadState(ctx context.Context) ([]byte, error) {
	key := t.b.stateKey(t.h.name)
	resp, err := t.b.client.Get(ctx, key)
	if err != nil {
		return nil, t.b.unavailable(ctx, "read the state of lease "+t.h.name+" ("+key+")", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	if v := resp.Kvs[0].Value; v != nil {
		return v, nil
	}
	return []byte{}, nil // stored, but empty: not the same as never stored
}

// StoreState implements baton.StateTerm. The put is one transaction with a
// comparison of this term's election key, so etcd itself refuses it once
// the term no longer holds the lease, whatever this process believes.
//
// Why "our key still has our create revision" means "we still hold the
// lease": the term began when a read at one revision found our key and no
// key under the election prefix with a lower create revision. etcd gives
// every key it creates a revision above all earlier ones, so a key created
// since sorts after ours, and none can ever sort before it. Ours therefore
// stays the oldest, the holder's, for exactly as long as it exists with that
// create revision; once deleted (by Resign, an operator, or the session's
// expiry) it can only come back with a higher one.
//
// The put is not attached to the session: the state outlives every holder.
func (t *stateTerm) StoreState(ctx context.Context, value []byte) error {
	if err := backend.CheckStateSize(value); err != nil {
		return err
	}
	if err := backend.EndedError(t); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err // nothing was sent
	}
	h := t.h
	key := t.b.stateKey(h.name)
	resp, err := t.b.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)).
		Then(clientv3.OpPut(key, string(value))).
		Commit()
	if err != nil {
		// Not b.unavailable: even when ctx ended, the put may have landed,
		// and ErrBackendUnavailable is what says so.
		return fmt.Errorf("%w: store the state of lease %q (it may or may not have been stored; LoadState tells): %w",
			baton.ErrBackendUnavailable, h.name, err)
	}
	if resp.Succeeded {
		return nil
	}
	// The watcher ends the term too when it sees the deletion, but its event
	// may still be on the way; etcd's answer is already final.
	lost := fmt.Errorf("%w: lease %q: election key %s (create revision %d) is gone, so etcd refused to store the lease's state",
		baton.ErrLeaseLost, h.name, h.key, h.rev)
	h.s.Forget(h.term)
	if h.term.End(lost) {
		t.b.log.Info("lease lost", "lease", h.name, "token", h.rev, "why", "a state write found the election key gone")
	}
	return lost
}
