// Package cas is the lease loop shared by every backend that stores a lease as
// one record in a store with compare-and-swap (PostgreSQL, Redis, DynamoDB,
// Kubernetes, and the in-process backend/memory).
//
// # Guarantees
//
// A record store has no server-side sessions, so liveness rests on versions:
//
//   - A contender takes a lease over only after it has seen the record's
//     version unchanged for a full TTL (the longer of the holder's recorded TTL
//     and its own) on its own monotonic clock. The holder's term ends at the
//     start of its last confirmed renewal + TTL − drift margin, which is
//     earlier, provided clock rates differ by less than the margin.
//   - Every acquisition is a compare-and-swap that bumps the record's token,
//     so tokens strictly increase; a release clears the holder but keeps the
//     token, so the next acquisition still moves it forward. A record
//     created afresh starts at epoch<<32 + 1, the epoch being the creating
//     candidate's wall-clock second (see RecordKeeper), so tokens keep rising
//     when the store loses its records, if that candidate's clock reads a
//     later second than the lost record's epoch.
//   - A renewal whose reply was lost but which did land is recognised by the
//     next read (the record still names this holder and token) and adopted,
//     not mistaken for a loss.
//   - A released record is taken at once; a waiter learns of the release from
//     the store's RecordNotifier when it has one, otherwise at its next poll.
//   - The lease's state (baton.StateTerm) lives in the record, so the store
//     fences it: StoreState is a compare-and-swap from the version the term
//     last wrote, refused once another holder has taken the record over.
//     Every write of the record carries the state on: renewals, releases,
//     and acquisitions, which copy the state of the record they replace.
//     One term's writes of its record (renewals, StoreState, the release)
//     take turns, so none writes back a state older than the last one
//     stored. A StoreState moves the version as a renewal does, so it
//     extends the term as one does.
//
// Not guaranteed: Leader may name a holder that died, because nobody can
// tell a dead holder from a slow one without watching its record for a TTL,
// and Leader does not wait: the record names the dead holder until a
// candidate that campaigned has seen it unrenewed for a TTL and taken it
// over. With nobody campaigning, that is indefinitely.
package backend

import (
	"context"
	"errors"
	"time"
)

// ErrConflict is returned (possibly wrapped) by RecordStore.CompareAndSwap when the
// record's version is not the expected one.
var ErrConflict = errors.New("cas: version conflict")

// LeaseRecord is what a RecordStore keeps for one lease.
type LeaseRecord struct {
	// Holder is the holding candidate's ID, or "" when the lease is free.
	Holder string
	// Token is the fencing token of the latest term; never reset.
	Token uint64
	// TTL is the holder's TTL: contenders wait at least this long.
	TTL time.Duration
	// Since is the wall-clock start of the term; informational only.
	Since time.Time
	// State is the lease's state (baton.StateTerm.StoreState), at most
	// baton.MaxStateSize bytes, or nil when no term ever stored one; a
	// stored empty value is empty but not nil. It belongs to the lease, not
	// to a term: the RecordBackend copies it into every record it writes,
	// including releases and the acquisitions of new holders. A RecordStore keeps
	// it with the rest of the record, in the same compare-and-swap (say, a
	// bytea column in PostgreSQL, a field of the hash in Redis, a binary
	// attribute in DynamoDB). A RecordStore that cannot tell nil from empty may
	// return nil for both; an empty state then reads as none.
	State []byte
}

// RecordStore is a compare-and-swap record store. Implementations must be safe for
// concurrent use.
type RecordStore interface {
	// Get returns the record of name and its version: the latest one (a
	// linearizable read), since LoadState promises a new holder everything
	// its predecessors stored. An absent record has version 0 and the zero
	// LeaseRecord. The caller may keep rec.State; the RecordStore must not change it
	// afterwards.
	Get(ctx context.Context, name string) (LeaseRecord, uint64, error)

	// CompareAndSwap stores rec as the record of name if its current version is
	// version (0: only if absent) and returns the new version, which must differ
	// from every earlier version of that record even when rec is unchanged. It
	// returns an error wrapping ErrConflict when the version differs. Any other
	// error leaves the outcome unknown: the write may have landed. The RecordStore
	// must not change rec.State (the caller may still read it).
	CompareAndSwap(ctx context.Context, name string, version uint64, rec LeaseRecord) (uint64, error)
}

// RecordKeeper is an optional RecordStore capability: a RecordStore whose KeepsRecords
// returns true never loses a record it has written, for as long as any
// candidate uses it (the in-process memory store, which lives and dies
// with its candidates). Its records' tokens start at 1. Every other RecordStore
// may lose records (Redis without persistence, a table dropped and made
// again), so a record created afresh, at version 0, starts its token at
// epoch<<32 + 1 instead, the epoch being the wall-clock second of the
// candidate that creates it (whole seconds since 2025-01-01T00:00:00Z), or
// one more than the highest epoch this RecordBackend saw in the lease's tokens.
// A later record thus outranks every token of a lost one, as long as its
// creator's clock reads a later second than the lost record's epoch and
// the lost record took fewer than 2^32 terms per second of its life.
type RecordKeeper interface {
	// KeepsRecords reports whether the RecordStore never loses a record.
	KeepsRecords() bool
}

// RecordNotifier is an optional RecordStore capability: a push notice when a record
// changes, so that waiters wake on a release without polling (LISTEN/NOTIFY,
// Redis pub/sub, a Kubernetes watch).
type RecordNotifier interface {
	// Notify returns a channel that receives a value (dropped if one is already
	// pending) after each change to name's record, until ctx ends.
	Notify(ctx context.Context, name string) (<-chan struct{}, error)
}
