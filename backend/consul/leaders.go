package consul

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton"
	"github.com/hashicorp/consul/api"
)

// leasesPerRead is how many leases one read-only transaction of Leaders
// reads: two keys each (the lock and the epoch), within the agent's limit
// of 128 operations a transaction (maxTxnOps).
const leasesPerRead = 64

var _ baton.LeadersReader = (*Backend)(nil)

// Leaders implements baton.LeadersReader: what Leader answers for each
// name, read with one consistent read-only transaction per 64 leases (the
// lock key and the epoch key of each, with get-or-empty, so that an absent
// key does not fail the transaction). The keys of one transaction are read
// at one index, so a token is never below what Leader would answer. On
// servers without get-or-empty (Consul before 1.14) it calls Leader for
// each name.
func (b *Backend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	recs := make([]baton.Record, len(names))
	errs := make([]error, len(names))
	if b.sessions.Closed() {
		for i := range errs {
			errs[i] = baton.ErrClosed
		}
		return recs, errs
	}
	for start := 0; start < len(names); start += leasesPerRead {
		end := min(start+leasesPerRead, len(names))
		if b.readEach.Load() || !b.leadersTxn(ctx, names[start:end], recs[start:end], errs[start:end]) {
			for i := start; i < end; i++ {
				recs[i], errs[i] = b.Leader(ctx, names[i])
			}
		}
	}
	return recs, errs
}

// leadersTxn answers for names into recs and errs with one transaction. It
// returns false, having answered nothing, when the servers do not know
// get-or-empty.
func (b *Backend) leadersTxn(ctx context.Context, names []string, recs []baton.Record, errs []error) bool {
	keys := make([]string, len(names)) // "" for a name that makes no key
	ops := make(api.TxnOps, 0, 2*len(names))
	for i, name := range names {
		key, err := b.Key(name)
		if err != nil {
			errs[i] = err
			continue
		}
		keys[i] = key
		ops = append(ops,
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: key}},
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVGetOrEmpty, Key: epochKey(key)}})
	}
	if len(ops) == 0 {
		return true
	}
	results, err := b.readTxn(ctx, ops)
	if errors.Is(err, errNoGetOrEmpty) {
		b.log.Info("the Consul servers do not know the transaction verb get-or-empty (Consul before 1.14): reading one lease a request")
		b.readEach.Store(true)
		return false
	}
	if err != nil {
		err = b.unavailable(ctx, fmt.Sprintf("read %d leases", len(ops)/2), err)
	}
	n := 0
	for i, name := range names {
		if keys[i] == "" {
			continue
		}
		if err != nil {
			errs[i] = err
			continue
		}
		lock, epoch := present(results[n].KV), present(results[n+1].KV)
		n += 2
		recs[i], errs[i] = b.recordWith(ctx, name, keys[i], lock, epoch)
	}
	return true
}

// errNoGetOrEmpty is readTxn's error from servers that do not know the
// verb get-or-empty.
var errNoGetOrEmpty = errors.New("consul: the servers do not know the transaction verb get-or-empty")

// readTxn runs ops, all reads, as one consistent read-only transaction and
// returns one result per op. A token that may not read some of the keys
// gets an error wrapping ErrPermissionDenied, as a read of one would:
// Consul leaves such results out of a read-only transaction's answer.
func (b *Backend) readTxn(ctx context.Context, ops api.TxnOps) (api.TxnResults, error) {
	ctx, end, err := b.request(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	ok, resp, _, err := b.client.Txn().Txn(ops, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, permissionErr(err)
	}
	if !ok {
		var what []string
		for _, e := range resp.Errors {
			// The ACL pre-check's words, then the state store's.
			if strings.Contains(e.What, "unknown KV operation") || strings.Contains(e.What, "unknown KV verb") {
				return nil, errNoGetOrEmpty
			}
			what = append(what, e.What)
		}
		return nil, fmt.Errorf("consul: read-only transaction refused: %s", strings.Join(what, "; "))
	}
	if len(resp.Results) != len(ops) {
		return nil, fmt.Errorf("%w: a read of %d keys answered %d: the ACL token may not read the others", ErrPermissionDenied, len(ops), len(resp.Results))
	}
	return resp.Results, nil
}

// present returns p, or nil when p is get-or-empty's stand-in for an
// absent key (never written: no index).
func present(p *api.KVPair) *api.KVPair {
	if p == nil || p.ModifyIndex == 0 {
		return nil
	}
	return p
}
