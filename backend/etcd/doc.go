// Package etcd runs baton leases on etcd v3, using the key layout of etcd's
// own concurrency.Election so that etcd's tools see and join the same
// elections.
//
// Each Backend holds one etcd lease, its session, kept alive once per
// RenewInterval however many baton leases ride on it. A candidate's claim on
// lease NAME is the key Prefix + NAME + "/" + <session lease ID in hex>,
// whose value is the candidate ID; the holder is the key with the lowest
// create revision, and each waiter watches the key just before its own. The
// lease's state (baton.StateTerm) is the key Prefix + NAME + "!state",
// attached to no session and never deleted by the Backend.
//
//   - Fencing tokens are the lease's epoch<<32 (the key Prefix + NAME +
//     "!epoch") plus the create revision of the holder's key: they strictly
//     increase, whichever process holds them, also across a wiped etcd.
//   - A candidate takes over only when the older keys are gone: deleted by
//     Resign, Close or an operator, or by etcd when the holder's session
//     expires, a full TTL after it last applied a renewal.
//   - A term ends with baton.ErrExpired at the send time of its last
//     confirmed renewal + the granted TTL (or Config.TTL, if etcd granted
//     more) − DriftMargin, whether or not etcd
//     can be reached; a session etcd reports gone, or a deleted key, ends it
//     with baton.ErrLeaseLost.
//   - StoreState writes only while the holder's key still exists with the
//     term's create revision; LoadState is a linearizable read.
//
// Not guaranteed: an `etcdctl del` or `lease revoke` reaches the holder a
// round trip later, and a paused process may write late (send Term.Token
// downstream); etcd grants TTLs in whole seconds, at least its minimum (and
// at most MaxTTL: New refuses a longer TTL, and a server's refusal fails a
// campaign with a *TTLError, a *baton.ConfigError), so a
// lease may be held longer than Config.TTL, never shorter; Leader reports
// etcd's view, with a zero Record.Since; `etcdctl elect` and
// concurrency.Election candidates keep their own timing rules.
//
// The client is the caller's, never closed by the Backend:
//
//	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"10.0.0.1:2379"}})
//	b, err := etcd.New(client, etcd.Options{Config: backend.Config{TTL: 10 * time.Second}})
//	defer b.Close(context.Background()) // standbys take over at once
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report"})
//
// Lease names must not contain "/". The derivations and the interplay with
// etcd's tools are in docs/backends/etcd.md.
package etcd
