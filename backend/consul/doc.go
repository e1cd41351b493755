// Package consul runs baton leases on Consul's KV store and sessions, with
// the key and session conventions of `consul lock`, so that the CLI and
// baton exclude each other on the same prefix.
//
// Each Backend keeps one Consul session, renewed once per RenewInterval
// however many leases ride on it. Lease NAME is the key
// Prefix + NAME + "/.lock" (Prefix defaults to "baton/"), locked with the
// session, Flags api.LockFlagValue and the candidate ID as value: what
// `consul lock Prefix+NAME CMD` does. Its state (baton.StateTerm) is the key
// Prefix + NAME + "/.baton-state", which the Backend never deletes.
//
//   - Fencing tokens are the lease's epoch<<32 (Backend.EpochKey) plus the key's
//     ModifyIndex from the transaction that locked it: they strictly
//     increase, `consul lock`'s terms included, also across a Consul that
//     lost its data.
//   - A contender locks the key only once no session holds it: after the
//     holder deleted it, or after Consul invalidated the holder's session
//     and its lock-delay (by default TTL/6) passed.
//   - Consul promises to keep a session at least its TTL after a renewal; the
//     Backend asks for a session TTL of TTL/2 and ends a term at the send
//     time of its last confirmed renewal + TTL/2 − DriftMargin
//     (baton.ErrExpired), whether or not Consul can be reached. Consul's
//     default session_ttl_min is 10 s, so TTL must be at least 20 s (the
//     default); below twice the servers' minimum a campaign fails with a
//     *SessionTTLError, a *baton.ConfigError. Consul accepts session TTLs
//     of at most 24 h (MaxSessionTTL), so New refuses a TTL above 48 h.
//   - Waiting candidates queue under Prefix + NAME + "/.baton-queue/", each
//     watching only the entry before its own, so a release wakes one
//     waiter, first come first served (see queueName).
//   - A session found gone, or a key that stops being this term's lock, ends the
//     term with baton.ErrLeaseLost. StoreState is a transaction checking the
//     lock's session and ModifyIndex, so only the holder writes the state.
//
// Not guaranteed: an operator's delete or destroy reaches the holder a round
// trip later, and a paused process may write late (send Term.Token
// downstream); the waiters' queue (see queueName) orders baton's
// candidates only, and `consul lock` contends beside them; `consul lock`
// keeps its own timing rules; Leader reports Consul's view, with a zero
// Record.Since.
//
//	client, err := consul.NewClient(consul.ClientConfig{Address: "127.0.0.1:8500"})
//	b, err := consul.New(client, consul.Options{Prefix: "service/"})
//	defer b.Close(context.Background()) // standbys take over at once
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report"})
//
// The derivations (safe-until, lock-delay, health checks, riding out agent
// errors, costs, ACL policy, TLS) are in docs/backends/consul.md.
package consul
