// Package baton elects one leader among the instances of a service and runs
// leader-only work while, and only while, an instance leads.
//
// # What is guaranteed, and what is not
//
// A lease has a name; a candidate has an ID unique to its process
// incarnation; holding a lease for one continuous span is a term.
//
//   - Fencing tokens. Every term carries a token that is strictly greater than
//     the token of every earlier term of the same lease, on every backend,
//     also after the store lost its data: tokens fold in an epoch, the
//     second at which the store's data got it, which assumes wall clocks
//     that agree to the second across the loss (docs/guarantees.md).
//   - Safe-until. A holder's term has a deadline on the holder's monotonic
//     clock: the start of its last confirmed renewal, plus the TTL, minus a
//     drift margin. At that deadline the term ends and the Elector cancels
//     the callback's context, even when the backend cannot be reached.
//   - Takeover. A contender takes a lease over only after the server reports
//     the holder's session dead, or after it has itself seen the lease
//     unrenewed for a full TTL on its own monotonic clock.
//
// Together these keep two live leaders from acting at once, assuming only that
// clocks on different machines run at rates that differ by less than the drift
// margin; wall-clock offsets do not matter. They do not stop a process that is
// paused (by GC, SIGSTOP, a VM migration) between checking its leadership and
// performing a write: when it resumes, it may write after its successor began.
// No lease can prevent that. Fencing closes the gap: send Term.Token with
// every write to a downstream system, and have that system reject a token
// lower than the highest one it has seen. A callback that only ever talks to
// systems that check the token is safe even across pauses.
//
// Each backend documents what else it guarantees (see docs/guarantees.md):
// session backends such as etcd end a term as soon as the server expires the
// session; record stores (package backend/cas) rely on observed versions.
//
// # Using it
//
// Create a Backend (backend/memory in tests, backend/etcd in production),
// an Elector for a lease, and Run a callback:
//
//	e, err := baton.NewElector(backend, baton.ElectorConfig{Lease: "nightly-report"})
//	...
//	err = e.Run(ctx, func(ctx context.Context, t baton.Term) error {
//		return doLeaderWork(ctx, t.Token()) // stop when ctx is cancelled
//	})
//
// The callback's context is cancelled when the term ends; Run waits for the
// callback to return before it releases the lease, then campaigns again.
// IsLeader, Await, Status and Changes observe the Elector from elsewhere.
//
// Package baton imports only the standard library; backends import it, never
// the reverse.
package baton
