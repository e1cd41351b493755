// Package backend is the kit for writing a baton backend, and the timing
// every backend shares. Application authors need only its Config, to set a
// backend's TTL; everything else here is for backend authors. Package baton
// holds what applications use (Elector, Term, the errors); the backends in
// this repository (backend/etcd, backend/zookeeper, backend/consul,
// backend/raft, backend/kubernetes and backend/memory) are built with this
// kit, and a backend written outside the repository can use all of it
// (docs/backends/writing.md works one through).
//
// # What a backend must guarantee
//
// A backend implements baton.Backend, and its Terms keep the promises
// written on baton.Term:
//
//   - one holder per lease at a time, and a fencing token that strictly
//     increases across the terms of a lease, also after the store lost its
//     data (fold in an epoch, see "Epoch tokens" below and
//     docs/guarantees.md, "Tokens across a lost store");
//   - SafeUntil is the start of the last confirmed renewal plus the TTL
//     minus Config.DriftMargin (Config.SafeUntil computes it), on the
//     holder's monotonic clock, and the term ends by itself at that
//     deadline, even when the store cannot be reached; no reply from the
//     store moves it past the client's own TTL from its own send time
//     (Config.CapSafeUntil);
//   - a contender takes a lease over only after the store reports the
//     holder's session dead, or after it has itself seen the lease
//     unrenewed for a full TTL;
//   - Campaign's context bounds the wait, never the term, and a cancelled
//     campaign leaves nothing behind that could later make it leader;
//   - Close, where a backend has one (Close(ctx) error), ends every term
//     with an error wrapping baton.ErrClosed, and every Campaign after it
//     fails with baton.ErrClosed.
//
// The conformance suite in package batontest checks these against a real
// server: every backend runs batontest.Run.
//
// # Term basics
//
// BasicTerm is a ready-made Term: create it with NewBasicTerm when the
// lease is won, call Extend after each confirmed renewal, RenewFailed when
// one fails, End when the store says the lease is gone, and RequestResign
// when the store relays a request that the holder resign. Config is
// embedded in each backend's options; WithDefaults fills in and checks it.
// A backend that keeps lease state (baton.StateTerm) calls CheckStateSize
// and EndedError first thing in StoreState (StoreState does both for a
// session backend).
//
// # Record stores: RecordBackend
//
// A store that keeps a lease as one record and can compare-and-swap it
// (PostgreSQL, Redis, DynamoDB, Kubernetes, the in-process backend/memory)
// needs to implement only RecordStore (Get and CompareAndSwap, and
// optionally RecordNotifier, RecordPeeker, RecordQueue and RecordKeeper): NewRecordBackend runs the
// whole lease loop on it (campaign, renew, release, state) and returns a
// complete baton.Backend. Its log lines and the errors it makes itself
// name it "cas".
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
//     With a RecordQueue the release names the waiting process that came
//     first, and the others leave the record to it for a short
//     reservation, so that one process, not every one, sends a write.
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
//
// # Session backends: SessionManager
//
// SessionManager is the skeleton of the backends whose leases ride on one
// server session per Backend (etcd, ZooKeeper, Consul, raft).
//
// A session's safe-until is measured from the send time of its last
// confirmed renewal; every term riding on it is safe until then, and ends by
// itself (BasicTerm) if no renewal moves it. Whatever a SessionDriver
// reports, the SessionManager never lets a grant or renewal put safe-until
// past the moment it asked the SessionDriver + Config.TTL −
// Config.DriftMargin (Config.CapSafeUntil): a server's reply may shorten a
// term, never stretch it past the client's own TTL.
//
// A SessionManager holds what those backends share: the mutex, the closed
// flag and the wait group of the Backend's goroutines; the one live
// Session, granted on first use by one caller at a time, and handed to a
// campaign only while its renewals keep up (after a failed or overdue
// renewal, the campaign waits for the next confirmed one, or for a new
// session, rather than win a term born near the old safe-until); the loop that
// renews it every RenewInterval, or every SessionGrant.Interval (sooner
// when that would leave less than half an interval before safe-until); its
// end at safe-until (baton.ErrExpired) or when the server dropped it
// (baton.ErrLeaseLost); the slots that allow one campaign per lease name
// at a time, the Backend's other candidates for it waiting in line in the
// process (first come, first served), so that the server sees one
// campaign per Backend and a hand-over wakes one process;
// the clean-ups of what a cancelled campaign or a failed release left
// behind; and the order in which Close takes it all down.
//
// A backend supplies a SessionDriver: the requests on a server session
// (grant, renew, revoke) and how to tell that the server no longer has
// one. Campaigning (claiming a place, waiting for the first one, watching
// the held key or node, deleting it) stays in the backend, which calls the
// SessionManager at its seams: Campaign around a campaign, Session for the
// session to campaign on, Start when it won, CleanLater for what is left to
// delete, Close at the end.
//
// # Epoch tokens
//
// A store's own counter (a revision, a zxid, a raft index) starts again
// from zero when the store loses its data. EpochToken folds a store
// incarnation's epoch into fencing tokens, so that tokens keep rising
// across such a loss.
//
// A token is epoch<<32 + counter, where the epoch is the whole seconds
// since 2025-01-01T00:00:00Z (EpochTime(0)) of the wall-clock time at
// which this incarnation of the store was created (EpochOf), recorded in
// the store (FormatEpoch, ParseEpoch) so that every candidate computes the
// same token for a term.
// The sum (not a bitwise or) keeps counters of 2^32 and more working:
// ZooKeeper's zxid is its own epoch<<32 | n.
//
// Across a wipe, the new incarnation's tokens are above the old one's if
// (1) the wall clock of whoever creates the new epoch reads a later second
// than the old creator's did, and (2) the old counter stayed below
// (new epoch − old epoch)·2^32, that is, it grew by less than 2^32 per
// second of the old incarnation's life on average. A process that saw the
// old epoch and creates the new one needs neither: it writes an epoch
// above the old one whatever its clock says (EpochTracker.Next).
//
// Package backend imports only package baton and the standard library,
// never a backend.
package backend
