package baton

import "context"

// LeadersReader is implemented by a Backend that can say who holds many
// leases in fewer requests than one Leader call each: a transaction of
// reads on etcd, one query on PostgreSQL. A caller that reads thousands of
// leases every few seconds (package balance, which reads its group's
// member slots and the leases it balances) then costs the store a request
// per batch, not per lease.
type LeadersReader interface {
	// Leaders reports, for each of names, what Leader would: recs[i] and
	// errs[i] answer names[i], errs[i] wrapping ErrNoLeader when nobody
	// holds it. A request that fails as a whole sets every errs[i] to its
	// error. The answers come from one or a few reads of the store, each
	// as fresh as a Leader call's; the Backend splits a long list into the
	// requests its store accepts.
	Leaders(ctx context.Context, names []string) (recs []Record, errs []error)
}
