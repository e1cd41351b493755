package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

// stateKey is the key below a lease's prefix that holds the lease's state,
// beside the lock key. `consul lock` in its plain mode touches only
// ".lock"; in its semaphore mode (-n N) it reads the ".lock" key and the
// contenders' keys, named by session ID and tied to a session, and ignores
// keys without a session. The Backend's own conflict check (ErrKeyConflict)
// looks at the ".lock" key's flags only. The name does not begin with
// ".lock", so that a watch of one lease's lock key, a prefix query, does
// not cover it.
const stateKey = ".baton-state"

// StateKey returns the key at which lease name keeps its state, Prefix +
// name + "/.baton-state", beside its lock key (see Key), or the error Key
// would return for name. The key outlives the lease's terms, so that the
// next holder finds it; the Backend never deletes it.
func (b *Backend) StateKey(name string) (string, error) {
	key, err := b.Key(name)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(key, lockKey) + stateKey, nil
}

// term is a term of a lease held on Consul: the BasicTerm that the session
// renews, and the lease's state (baton.StateTerm). It is safe for
// concurrent use.
type term struct {
	*backend.BasicTerm
	b     *Backend
	h     *held
	state string // the state key
}

var _ baton.StateTerm = (*term)(nil)

// LoadState implements baton.StateTerm with a consistent read of the state
// key, which the servers' leader answers after confirming it still leads.
// It returns nil when the key does not exist, and works after the term
// ended too. An ACL refusal wraps ErrPermissionDenied; other failures wrap
// baton.ErrBackendUnavailable.
func (t *term) LoadState(ctx context.Context) ([]byte, error) {
	p, err := t.b.get(ctx, t.state)
	switch {
	case errors.Is(err, ErrPermissionDenied):
		return nil, fmt.Errorf("consul: lease %q: read state %s: %w", t.h.name, t.state, err)
	case err != nil:
		return nil, fmt.Errorf("%w: consul: lease %q: read state %s: %w", baton.ErrBackendUnavailable, t.h.name, t.state, err)
	case p == nil:
		return nil, nil
	case p.Value == nil:
		return []byte{}, nil // stored empty, which is not "never stored"
	default:
		return p.Value, nil
	}
}

// StoreState implements baton.StateTerm with one transaction that checks
// that the lock key is still this term's lock (our session holds it, and
// its ModifyIndex is still the one the term locked it at) and sets the state key, so
// that Consul applies the write only while the term holds the lease. When
// the check fails, the term ends with baton.ErrLeaseLost and so does
// StoreState's error. An ACL refusal wraps ErrPermissionDenied. Other
// failures, ctx ending included, wrap baton.ErrBackendUnavailable: the
// write may have landed (fenced all the same), and LoadState tells.
func (t *term) StoreState(ctx context.Context, value []byte) error {
	return backend.StoreState(ctx, t, value, t.store)
}

// store is StoreState once the term was found running: the store alone
// decides from here on.
func (t *term) store(ctx context.Context, value []byte) error {
	b, h := t.b, t.h
	// The session check alone would let a later term of the same session
	// pass (a Backend's session locks a key again after a Resign), or a
	// term whose key was overwritten while locked, which judge counts
	// as lost. The index check pins the very lock the term won: every write
	// to the key, a release by session invalidation included, changes its
	// ModifyIndex, and indexes never repeat.
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: h.key, Session: h.s.ID}},
		{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: h.key, Index: h.index}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: t.state, Value: value}},
	}
	resp, ok, err := b.txn(ctx, ops)
	switch {
	case errors.Is(err, ErrPermissionDenied):
		return fmt.Errorf("consul: lease %q: store state %s: %w", h.name, t.state, err)
	case err != nil:
		return fmt.Errorf("%w: consul: lease %q: store state %s (it may or may not have been stored): %w",
			baton.ErrBackendUnavailable, h.name, t.state, err)
	case !ok:
		var whats []string
		for _, e := range resp.Errors {
			whats = append(whats, e.What)
			if e.OpIndex == 0 || e.OpIndex == 1 {
				why := "is no longer this term's lock (" + e.What + ")"
				b.lost(h, why)
				h.stop()
				return fmt.Errorf("%w: consul: lease %q (token %d): the store refused the state: lock key %s %s",
					baton.ErrLeaseLost, h.name, h.token, h.key, why)
			}
		}
		return fmt.Errorf("consul: lease %q: store state %s: transaction failed: %s", h.name, t.state, strings.Join(whats, "; "))
	}
	return nil
}
