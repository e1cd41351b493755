// Package consul runs baton leases on Consul's KV store and sessions, with
// the key and session conventions of `consul lock`, so that the CLI and
// baton exclude each other on the same prefix.
//
// # What is guaranteed, and what is not
//
// Each Backend creates one Consul session, and every baton lease it
// campaigns for rides on it: a process renews one session per
// RenewInterval however many leases it holds. Lease NAME is held by
// locking the key
//
//	Prefix + NAME + "/.lock"       (Prefix defaults to "baton/")
//
// with the session, with the key's Flags set to api.LockFlagValue
// (0x2ddccbc058a50c18) and its value set to the candidate ID. That is the
// key, flag and lock that `consul lock Prefix+NAME CMD` (and api.Lock)
// use, so whichever locks the key first runs and the other waits.
//
//   - Fencing tokens. Term.Token is built from the ModifyIndex Consul gave
//     the key as this candidate locked it, read from the result of the very
//     transaction that locked it. Consul's indexes are raft log indexes,
//     which only grow, and a key can be locked only after the previous
//     lock on it is gone, so tokens strictly increase across the terms of
//     a lease, whoever holds them, `consul lock` included. Tokens are that
//     index plus the lease's epoch<<32: the epoch key (see EpochKey), read
//     in the locking transaction, keeps them rising when Consul loses its
//     data and its indexes start again, if the new epoch's writer has a
//     clock a second past the old epoch (or read the old epoch itself).
//   - Takeover only after the server says so. A contender locks the key
//     only when no session holds it: after the holder deleted it (Resign,
//     Close), or after Consul invalidated the holder's session, and then
//     only once the session's lock-delay has passed.
//   - Safe-until, measured from send time, on Consul's documented contract.
//     Consul promises to keep a session for at least its TTL after each
//     renewal it processes; it actually keeps it for twice the TTL (a
//     grace that its code calls an implementation detail, with "no
//     explicit promise about the upper bound"). baton asks Consul for a
//     session TTL of TTL/2 and ends a holder's terms at the send time of
//     its last confirmed renewal plus TTL/2 minus DriftMargin: within the
//     promised TTL/2, whatever the grace. A dead holder's session is
//     invalidated by the grace, about TTL after its last renewal, which
//     is why TTL is the failover time here. At the deadline the term ends
//     with baton.ErrExpired whether or not Consul can be reached, and the
//     Backend destroys that session (if it can) and starts a fresh one for
//     later campaigns.
//   - Loss is reported. When a renewal finds the session gone (its TTL ran
//     out, someone destroyed it, a health check failed), every term on it
//     ends with baton.ErrLeaseLost. When the key stops being this term's
//     lock — deleted, released, locked by another session, or rewritten —
//     the Backend's watch sees it and the term ends with
//     baton.ErrLeaseLost.
//
// What it does not guarantee:
//
//   - Operators are not instantaneous for the holder. After `consul kv
//     delete` of the holder's key, or `consul session destroy` of its
//     session, a contender may lock the key at once (after a destroy: once
//     the lock-delay passed), while the old holder learns of it only when
//     the watch's answer reaches it, a round trip later, or at its next
//     renewal. The same is true of any process paused (by GC, SIGSTOP, a
//     VM migration) between checking its leadership and writing. Only
//     fencing closes these gaps: send Term.Token with every write
//     downstream and have the downstream store reject a token lower than
//     the highest it has seen.
//   - A killed holder is replaced after about TTL (Consul's twice TTL/2)
//     plus the lock-delay, plus the moment Consul takes to apply the
//     invalidation — not after exactly TTL.
//   - No queue. Waiting leaves nothing in Consul (a cancelled campaign
//     leaves no trace), and when a lock goes every waiter tries to take it:
//     whoever's transaction lands first wins. There is no fairness.
//   - `consul lock` keeps its own timing rules. The CLI has no safe-until:
//     it renews its session (TTL 15 s) every 7.5 s, retries failed renewals
//     until 15 s have passed since the last success, and keeps its child
//     running until its blocking query sees the lock gone (riding out up to
//     three 500 errors a second apart, -monitor-retry); its protection is
//     Consul's default lock-delay of 15 s. A killed CLI holder blocks baton
//     for up to 30 s plus 15 s. baton's safe-until promise covers baton's
//     candidates only.
//   - Leader reports Consul's view: the key's current lock. Right after a
//     holder stopped at its safe-until (cut off from Consul, say), that may
//     still be the stopped holder, until Consul invalidates its session.
//     Consul keeps no times, so Record.Since is always the zero time.
//
// # Lease state
//
// Terms implement baton.StateTerm: each lease keeps one small value
// (baton.MaxStateSize bytes at most), shared by all its terms, at the key
//
//	Prefix + NAME + "/.baton-state"      (Backend.StateKey)
//
// beside the lock key. `consul lock` never touches it: in its plain mode it
// uses the ".lock" key alone, and its semaphore mode (-n N, which baton
// refuses with ErrKeyConflict anyway) ignores keys that no session holds.
// The key outlives the terms, and the Backend never deletes it: delete it
// by hand when a lease is retired.
//
//   - Fenced by the store. StoreState is one transaction: a check that the
//     lock key is held by the term's session, a check that its ModifyIndex
//     is still the term's token (so that neither a later term of the same
//     session nor a rewritten key passes), and the write of the state key.
//     Consul applies it only while the term holds the lease, whatever the
//     holder's clock says. When a check fails, the term ends with
//     baton.ErrLeaseLost and the state is unchanged; a holder paused and
//     replaced, by baton or by `consul lock`, cannot overwrite what its
//     successor stored. A StoreState whose answer is lost returns an error
//     wrapping baton.ErrBackendUnavailable: it may have landed, fenced all
//     the same.
//   - LoadState is a consistent read (?consistent), which the servers'
//     leader answers only after confirming that it still leads.
//   - The ACL token needs key:write on the state key too (the key_prefix
//     policy below covers it); a refusal wraps ErrPermissionDenied.
//   - A Backend's blocking query covers the state keys of the leases under
//     the common prefix of the keys it watches (when it watches more than
//     one), so each StoreState makes it re-read that prefix once.
//
// # Lock-delay
//
// When Consul invalidates a session — its TTL ran out, a health check
// failed, or someone destroyed it — it releases the session's locks and
// refuses to lock those keys again for the session's lock-delay (Consul's
// default: 15 s), so that a holder that has not noticed yet can stop
// first. Explicit deletes and releases are not delayed: Resign and Close
// delete the key, and Close does so before it destroys the session.
//
// Without health checks (the default), baton does not need the delay for
// exclusion: a session is invalidated by its TTL only after its holder's
// safe-until has passed. So the default is short, TTL/6, to give a
// holder whose session was destroyed under it time to notice at its next
// renewal (or its retry), without adding seconds to every failover. A waiter
// that sees a lock invalidated knows the holder session's lock-delay (it
// looked the session up when it first saw it) and tries again when it has
// passed, rather than polling; a lock-delay it could not learn is waited
// out with a back-off capped at one second.
//
// # Health checks
//
// Options.Checks and ServiceChecks tie health checks to the session, as
// Consul does with serfHealth by default (baton does not: it passes an
// empty list). A failing check invalidates the session at once, ending
// every term on it, typically when the node is partitioned and its holder
// cannot hear about it until its safe-until; so with checks, LockDelay
// must be at least the session TTL (it defaults to it), or a contender
// could take the lock while the old holder still acts.
//
// # Riding out agent errors, and what it costs
//
// A renewal that fails (the agent restarting, a 500 while the servers
// elect a leader, a dropped connection) is retried four times as often as
// usual until the holder's safe-until, and a renewal that succeeds in
// time extends the terms as if nothing had happened. This costs nothing
// for exclusion: a term ends at its safe-until whatever the retries do,
// and Consul keeps the session for at least the session TTL after the
// last renewal it processed, which was sent no earlier than the last
// confirmed one. What it costs is knowledge: while its requests fail, a
// holder cannot see its key deleted, its session destroyed or a health
// check fail, so for the rest of its safe window it keeps acting on a
// lease it may have lost — exactly the gap that lock-delay (with checks)
// and fencing tokens (always) are for. Each retry is bounded by the
// safe-until it tries to extend; a renewal answered after it is ignored,
// and the session is abandoned. A failed watch is retried with a back-off;
// waiting campaigns then fail with baton.ErrBackendUnavailable (the
// Elector campaigns again), held terms carry on under their safe-until. A
// lock transaction whose answer is lost (the campaign's ctx ended, the
// connection dropped) may still have taken the key: the failing campaign
// then deletes the key if its session holds it, retrying in the background
// (the lease name stays reserved meanwhile) if it cannot, so that no lock
// is left behind that no term would ever release.
//
// # Costs
//
// A Backend sends one session renewal per RenewInterval, and keeps one
// blocking query open, on the longest common prefix of the keys it holds
// and waits for, however many there are: each HTTP blocking query takes a
// connection, and agents allow 200 per client address by default. When a
// key under that prefix changes, the query re-reads all of it; give
// unrelated groups of leases prefixes of their own. Waiters wake from that
// query, not by polling. An uncontended campaign costs a read and a
// transaction.
//
// # ACL tokens and TLS
//
// The Backend uses the client's settings: api.Config.Token (or TokenFile)
// for ACLs and api.Config.TLSConfig for HTTPS; NewClient builds a client
// from a ClientConfig, falling back to Consul's environment variables. The
// token needs a policy such as
//
//	session_prefix "" { policy = "write" }  # or: session "NODE" for the agent's node
//	key_prefix "baton/" { policy = "write" }
//
// A refused request gives an error wrapping ErrPermissionDenied.
//
// # Using it
//
// The client is the caller's (it holds nothing that needs closing):
//
//	client, err := consul.NewClient(consul.ClientConfig{Address: "127.0.0.1:8500"})
//	...
//	b, err := consul.New(client, consul.Options{Prefix: "service/"})
//	...
//	defer b.Close(context.Background()) // standbys take over at once
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report"})
//
// While it runs, `consul lock service/nightly-report ./report.sh` waits
// for baton's holder, and baton's candidates wait for it. Lease names may
// contain "/", as long as Prefix+NAME is a clean path, since `consul lock`
// cleans its prefix (path.Join) before appending "/.lock". The baton CLI's
// consul://HOST:PORT/PREFIX URL maps to a ClientConfig and Prefix through
// ParseURL.
//
// Consul's default session_ttl_min is 10 s, and the session TTL is TTL/2,
// so TTL must be at least 20 s (the default) unless the servers' minimum is
// lowered; a TTL below twice the minimum fails the campaign with a
// *SessionTTLError saying so, which is a *baton.ConfigError: the Elector
// returns it rather than retrying.
package consul
