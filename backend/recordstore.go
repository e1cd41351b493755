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
	// Next is, in a released record, the process the release handed the
	// lease to: the head of the lease's RecordQueue when it was released
	// (see RecordQueue). Empty in every other record, and always empty
	// when the RecordStore is no RecordQueue.
	Next string
	// Process is, in a held record, the holder's process
	// (RecordBackend.Process), so that whoever takes the lease over from
	// a holder that stopped renewing takes that process out of the
	// lease's RecordQueue too. Empty when the RecordStore is no
	// RecordQueue.
	Process string
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

// RecordMultiGetter is an optional RecordStore capability: the records of
// many leases in one request. RecordBackend.Leaders uses it, so that a
// caller reading thousands of leases (package balance) costs the store a
// request per batch.
type RecordMultiGetter interface {
	// GetMany returns what Get would for each of names, as fresh: recs[i]
	// and versions[i] for names[i], an absent record as the zero
	// LeaseRecord at version 0. An error fails the whole request. The
	// caller may keep each rec.State.
	GetMany(ctx context.Context, names []string) (recs []LeaseRecord, versions []uint64, err error)
}

// RecordNotifier is an optional RecordStore capability: a push notice when a record
// changes, so that waiters wake on a release without polling (LISTEN/NOTIFY,
// Redis pub/sub, a Kubernetes watch).
type RecordNotifier interface {
	// Notify returns a channel that receives a value (dropped if one is already
	// pending) after each change to name's record, until ctx ends.
	Notify(ctx context.Context, name string) (<-chan struct{}, error)
}

// RecordPeeker is an optional RecordNotifier capability: notifications that
// carry the record (a Kubernetes watch's events do), so that a waiter woken
// by one needs no read. A waiter peeks only after a notification woke it;
// it still reads (Get) when it starts, at each poll, and whenever Peek has
// nothing. A peeked record may be older than the store's (the
// notification of a newer write may still be on its way): that is safe,
// since every write is a compare-and-swap against the version read, and a
// waiter that lost one waits for the next notification rather than
// reading.
type RecordPeeker interface {
	// Peek returns the newest record of name the RecordStore knows from
	// its notifications, reads and writes, and its version; ok is false
	// when it knows none, or no Notify for name is running.
	Peek(name string) (rec LeaseRecord, version uint64, ok bool)
}

// RecordQueue is an optional RecordNotifier capability: a queue of the
// processes (RecordBackends) waiting for each lease, kept beside its
// record. A release then names the queue's head in the record it writes
// (LeaseRecord.Next); the head takes the lease as soon as the release's
// notification reaches it, and every other waiting process leaves it to
// the head for a short reservation (a tenth of the TTL, at most one
// second) after it saw the release. So a hand-over costs one acquisition,
// not a compare-and-swap from every waiting process of which all but one
// fail. A process that stays in the queue after the lease went to it (its
// candidates keep waiting for the next term) goes back to the tail, so
// the processes take turns.
//
// The queue serves liveness only: every acquisition is still a
// compare-and-swap of the record, so a queue that is lost, stale or out of
// order, a head that died, or a process that ignores the reservation
// (client-go's elector, say) delays a hand-over by the reservation at most
// and never lets two candidates hold a lease. A head that let its
// reservation pass is dropped from the queue by whoever took the lease.
// Implementations must be safe for concurrent use.
type RecordQueue interface {
	// JoinQueue puts process at the tail of name's queue, moving it there
	// when it is in the queue already.
	JoinQueue(ctx context.Context, name, process string) error
	// LeaveQueue takes process out of name's queue; a process that is not
	// in it is no error.
	LeaveQueue(ctx context.Context, name, process string) error
	// QueueHead returns the process at the head of name's queue, passing
	// over skip (the releasing process, which may be on its way out of
	// the queue or back to its tail), or "" when there is no other.
	QueueHead(ctx context.Context, name, skip string) (string, error)
	// DropQueueHead takes process out of name's queue if it is the head;
	// one that joined again since (it is at the tail) stays.
	DropQueueHead(ctx context.Context, name, process string) error
}
