package baton

import (
	"context"
	"errors"
)

// MaxStateSize is the largest value a StateTerm stores. It fits every
// backend's limit with room to spare (ZooKeeper's 1 MB node, Consul's 512 KB
// value, etcd's 1.5 MB request) and keeps a renewal-sized write small.
const MaxStateSize = 4096

// ErrStateTooLarge is returned by StoreState for a value longer than
// MaxStateSize.
var ErrStateTooLarge = errors.New("baton: state value too large")

// StateTerm is implemented by the Terms of backends that keep a small value
// with each lease: the lease's state, shared by all its terms, and written
// only by the current holder. The write is fenced by the store itself, not by
// the holder's clock: the store accepts it only while this term still holds
// the lease there (etcd: a transaction comparing the holder's key; ZooKeeper:
// a multi checking the latch node; Consul: a transaction checking the lock's
// session; raft and record stores: the same command that checks the token).
// A holder that was paused past its safe-until, and replaced, cannot
// overwrite what its successor wrote.
//
// Package schedule keeps the last slot of a cron job this way, so that a new
// leader neither repeats nor loses a slot across a failover.
//
// Every backend in this module implements StateTerm; for a Term of unknown
// origin, a type assertion tells: st, ok := t.(baton.StateTerm).
type StateTerm interface {
	Term

	// LoadState returns the lease's state as the last holder to store one
	// left it, or nil when no term of the lease ever stored one. It reads
	// the latest value (a linearizable read on the store), so that a new
	// holder sees everything its predecessors stored.
	LoadState(ctx context.Context) ([]byte, error)

	// StoreState replaces the lease's state with value, if and only if this
	// term still holds the lease in the store. Otherwise it returns an error
	// wrapping ErrLeaseLost (the store says another term holds the lease, or
	// none) or the term's own end reason once the term has ended; the
	// stored value is then unchanged. An error wrapping
	// ErrBackendUnavailable means the outcome is unknown: the write may or
	// may not have happened, and a later LoadState tells. A value longer
	// than MaxStateSize gives ErrStateTooLarge.
	StoreState(ctx context.Context, value []byte) error
}
