package baton

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"time"
)

// Backend is a lease store that candidates campaign on. Implementations are
// safe for concurrent use; one Backend value stands for one process's view of
// the store (one session where the store has sessions), and holds any number
// of leases at once.
type Backend interface {
	// Campaign blocks until c holds the lease name, or ctx ends. ctx bounds the
	// wait only, never the term: cancelling it after Campaign returned has no
	// effect on the Term. A candidate that stops waiting leaves no trace behind
	// that could later make it leader unknowingly.
	Campaign(ctx context.Context, name string, c Candidate) (Term, error)

	// Leader reports the current holder of name, or an error wrapping
	// ErrNoLeader when nobody holds it.
	Leader(ctx context.Context, name string) (Record, error)
}

// Term is one continuous span of holding a lease. Its methods are safe for
// concurrent use.
type Term interface {
	// Lease is the name of the lease this term holds.
	Lease() string

	// Token is the fencing token of this term: it is strictly greater than the
	// token of every earlier term of the same lease, on every backend. Pass it
	// with every write to a downstream store and have the store reject a token
	// lower than the highest it has seen.
	Token() uint64

	// SafeUntil is the deadline, on this process's monotonic clock, until which
	// no other candidate can have taken the lease. It moves forward with each
	// confirmed renewal. At SafeUntil the term ends by itself (Err returns
	// ErrExpired) even if the backend cannot be reached.
	SafeUntil() time.Time

	// Done is closed exactly once, when the term ends for any reason.
	Done() <-chan struct{}

	// Err is nil while the term lasts and afterwards says why it ended: it
	// wraps ErrResigned, ErrLeaseLost, ErrExpired or ErrClosed.
	Err() error

	// Resign ends the term (Err then wraps ErrResigned) and releases the lease
	// so that a waiting candidate takes over at once, without waiting for a
	// TTL. Call it once the work done under the term has stopped. The term ends before the release is attempted, so the holder stops
	// acting even if releasing fails; a failed release is returned, and the
	// lease then expires after its TTL. Resign after the term ended is a no-op.
	Resign(ctx context.Context) error
}

// ResignRequestTerm is implemented by the Terms of backends through which
// a resign can be requested from outside the holding process: on raft, an
// operator's POST /v1/leases/NAME/resign to `baton agent`
// (raft.Node.RequestResign). A requested resign does not end the term and
// does not release the lease. It asks the holder to stop its work; the
// holder then calls Resign, which releases the lease. So nobody else gets
// the lease before the holder's work has stopped.
//
// Elector does this by itself: it cancels the callback's context (with a
// cause wrapping ErrResigned that says the resign was requested), waits for
// the callback to return, then resigns.
//
// A program that holds Terms without an Elector watches ResignRequested
// itself (ResignRequestedOf works on any Term). A holder that never looks
// keeps the lease: the request stays pending until the holder resigns or its
// term ends for another reason. Nothing takes a lease from a live holder
// behind its back.
type ResignRequestTerm interface {
	Term

	// ResignRequested returns a channel that is closed, once, when a resign
	// of this term was requested. It stays open for a term nobody asked to
	// resign, also after the term ended: select on Done as well.
	ResignRequested() <-chan struct{}
}

// ResignRequestedOf returns t's ResignRequested channel, or nil (a channel
// that is never ready) when t's backend cannot relay resign requests.
func ResignRequestedOf(t Term) <-chan struct{} {
	if rt, ok := t.(ResignRequestTerm); ok {
		return rt.ResignRequested()
	}
	return nil
}

// Predecessor is the term of a lease before a given one, as its backend
// recorded it.
type Predecessor struct {
	// First reports that the backend knows of no earlier term of the
	// lease; the other fields are then empty.
	First bool
	// Holder is the candidate ID that held the earlier term.
	Holder string
	// Via is the process the holder campaigned through, when the backend
	// records it (a raft member's ID); empty otherwise.
	Via string
	// Token is the earlier term's fencing token.
	Token uint64
	// Ended says how the earlier term ended, in a few words: "resigned",
	// "resigned on request", "released as its process stopped", or
	// "expired: not renewed within the TTL (the holder or its member was
	// lost)".
	Ended string
}

// PredecessorTerm is implemented by the Terms of backends that record how
// a lease changed hands (raft). An Elector names the predecessor in its
// "elected" log line.
type PredecessorTerm interface {
	Term

	// Predecessor returns the term before this one; false when the
	// backend does not know it (a raft member that caught up from a
	// snapshot, say).
	Predecessor() (Predecessor, bool)
}

// Candidate is a contender for a lease.
type Candidate struct {
	// ID identifies the candidate and must be unique per process incarnation
	// (NewCandidateID makes one: host name plus a random suffix), so that a
	// restarted process never mistakes its predecessor's lease for its own.
	// It is what Leader reports as Record.Holder.
	ID string
}

// Record describes the holder of a lease as the backend reports it.
type Record struct {
	// Lease is the lease name.
	Lease string
	// Holder is the holding candidate's ID.
	Holder string
	// Token is the holder's fencing token.
	Token uint64
	// Since is the wall-clock time at which the term began, when the backend
	// records it; the zero Time when it does not (etcd). It is informational:
	// no safety decision rests on wall clocks.
	Since time.Time
}

// NewCandidateID returns an ID of the form "HOST/SUFFIX", where HOST is the
// host name and SUFFIX eight random hexadecimal digits.
func NewCandidateID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "baton"
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux since Go 1.24
	return host + "/" + hex.EncodeToString(b[:])
}
