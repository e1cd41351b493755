// Package etcd runs baton leases on etcd v3, using the key layout of etcd's
// own concurrency.Election so that etcd's tools see and join the same
// elections.
//
// # What is guaranteed, and what is not
//
// Each Backend holds one etcd lease, its session, and every baton lease it
// campaigns for rides on that session: a process sends one keep-alive per
// RenewInterval however many leases it holds. A candidate's claim on lease
// NAME is the key
//
//	Prefix + NAME + "/" + <session lease ID in hexadecimal>
//
// whose value is the candidate ID, attached to the session. The holder is the
// candidate whose key has the lowest create revision; the others wait, each
// watching the deletion of the key just before its own. The lease's state
// (baton.StateTerm) is the key
//
//	Prefix + NAME + "!state"
//
// attached to no session, so that it outlives every holder; nothing deletes
// it (`etcdctl del` resets a lease's state). It holds no "/" after the
// Prefix, so it never falls under an election's key prefix, NAME + "/": etcd
// tools and Leader do not see it as a candidate.
//
//   - Fencing tokens. Term.Token is the lease's epoch<<32 plus the create
//     revision of the holder's key. etcd revisions only grow, and a key
//     becomes the oldest only after every older key is gone, so tokens
//     strictly increase across the terms of a lease, whichever process
//     holds them. The epoch, the key Prefix + NAME + "!epoch" (put if
//     absent, read in the transaction that creates the candidate's key),
//     keeps them rising when etcd loses its data and its revisions start
//     again, if the new epoch's writer has a clock a second past the old
//     epoch (or read the old epoch itself).
//   - Takeover only after the server says so. A candidate takes over only when
//     the older keys are gone: deleted by their holder's Resign or Close, by
//     an operator, or by etcd itself when it expires the holder's session,
//     which it does a full TTL after it last applied a renewal of it.
//   - Safe-until, measured from send time. A holder's term lasts until the
//     time it *sent* its last renewal that etcd confirmed, plus the TTL etcd
//     granted, minus DriftMargin. etcd applies a renewal only after it was
//     sent, so the server expires the session no earlier than that deadline
//     plus the margin, even when replies are slow or lost. At the deadline
//     the term ends with baton.ErrExpired whether or not etcd can be reached,
//     and the Backend drops that session (revoking it if it can) and starts a
//     fresh one for later campaigns, so that its stale keys cannot queue
//     ahead of others.
//   - Loss is reported. When etcd reports the session gone, or the holder's
//     key is deleted, the term ends with baton.ErrLeaseLost.
//   - The state is fenced by etcd. StoreState is a transaction that puts the
//     state key only if the holder's election key still exists with the
//     term's create revision, which is true exactly while the term holds the
//     lease in etcd; a holder that was paused and replaced gets
//     baton.ErrLeaseLost, however sure it is of its term, and its successor's
//     state stands. LoadState is a linearizable read.
//
// What it does not guarantee:
//
//   - Deletion by hand is not instantaneous for the holder. After `etcdctl
//     del` of the holder's key, or `etcdctl lease revoke` of its session, the
//     next candidate may take over at once, while the old holder learns of it
//     only when the watch event reaches it, a network round trip later. The
//     same is true of any process paused (by GC, SIGSTOP, a VM migration)
//     between checking its leadership and writing. Only fencing closes these
//     gaps: send Term.Token with every write downstream and have the
//     downstream store reject a token lower than the highest it has seen.
//   - etcd grants TTLs in whole seconds. The TTL is rounded up to the next
//     second, and etcd may raise it further, to its minimum of 1.5 election
//     timeouts (2 s with etcd's default 1 s election timeout). The Backend
//     then times safe-until by the TTL etcd granted, so a holder may keep a
//     lease longer than Config.TTL says, never shorter.
//   - A killed holder is replaced after the granted TTL plus the delay of
//     etcd's lease expiry loop (up to 500 ms), not after exactly the TTL.
//   - Leader reports etcd's view: the candidate with the oldest key. Right
//     after a holder stopped at its safe-until (for instance because it was
//     cut off from etcd) that may still be the stopped holder, until etcd
//     expires its session. etcd keeps no times, so Record.Since is always the
//     zero time.
//   - Programs that join the same election through concurrency.Election, or
//     `etcdctl elect`, contend fairly and get tokens from the same sequence,
//     but they keep their own timing rules: baton's safe-until promise covers
//     baton's candidates only.
//
// # Using it
//
// The client is the caller's: the Backend never closes it, which also lets a
// caller confine baton to a key space with the client's namespace wrappers
// (go.etcd.io/etcd/client/v3/namespace).
//
//	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"10.0.0.1:2379"}})
//	...
//	b, err := etcd.New(client, etcd.Options{Config: backend.Config{TTL: 10 * time.Second}})
//	...
//	defer b.Close(context.Background()) // standbys take over at once
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report"})
//
// While it runs, `ETCDCTL_API=3 etcdctl elect --listen nightly-report`
// prints the holder's key and candidate ID each time the lease changes hands
// (with a Prefix, name the election Prefix + "nightly-report").
// Lease names must not contain "/": the prefixes of elections "a" and "a/b"
// would overlap, so each would see the other's candidates. Put shared path
// segments in Options.Prefix instead.
package etcd
