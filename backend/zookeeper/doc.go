// Package zookeeper runs baton leases on Apache ZooKeeper (3.5 or later),
// using the node layout of Apache Curator's LeaderLatch recipe, so that Go
// services on baton and JVM services on Curator can share one election.
//
// Each Backend rides on one ZooKeeper session, renewed once per
// RenewInterval however many leases it holds: on an ensemble a sync every
// TTL/6 (with no pings besides while syncs flow), on a standalone server
// the client's own pings, every third of the session timeout, and nothing
// more (on a connection dialed through a SessionProbe). Lease NAME has the latch path
// Root + "/" + NAME (Root defaults to "/baton"); a candidate's claim is an
// ephemeral sequential child _c_<UUID>-latch-<sequence> holding its
// candidate ID. The node that sorts first, as Curator sorts, holds the
// lease; each waiter watches only the node before its own. The lease's state
// (baton.StateTerm) is the persistent node Root + "/.baton-state/" + NAME.
//
//   - Fencing tokens are the epoch<<32 (the node Root + "/.baton-epoch")
//     plus the czxid of the holder's node: they strictly increase, Curator's
//     terms included, also across a ZooKeeper that lost its data.
//   - A candidate takes over only when the nodes before its own are gone:
//     deleted by Resign, Close or an operator, or by ZooKeeper when it expires
//     the holder's session.
//   - A term ends with baton.ErrExpired at the send time of its last
//     renewal that confirmed the session − the ensemble lag (none on a
//     standalone server) + the negotiated session timeout (or the TTL,
//     if the server granted more) − DriftMargin, whether or not ZooKeeper
//     can be reached. A negotiated timeout too short for RenewInterval and
//     DriftMargin (a TTL above the servers' maxSessionTimeout, say) fails
//     the campaign with a *SessionTimeoutError, a *baton.ConfigError. Across
//     a lost connection (Curator's SUSPENDED) a term carries on until then;
//     an expired session (LOST) or a deleted node ends it with
//     baton.ErrLeaseLost.
//   - StoreState is a multi checking the term's latch node, so only the
//     holder writes the state; LoadState syncs before it reads.
//
// Not guaranteed: a deletion by hand reaches the holder a round trip later,
// and a paused process may write late (send Term.Token downstream); a killed
// holder is replaced after the session timeout plus up to one server tick;
// Leader reports ZooKeeper's view, with a zero Record.Since; Curator's
// candidates keep Curator's timing rules.
//
//	b, err := zookeeper.Dial(ctx, []string{"zk1:2181", "zk2:2181", "zk3:2181"}, zookeeper.DialOptions{
//		Options: zookeeper.Options{Config: backend.Config{TTL: 10 * time.Second}, Root: "/services/billing"},
//	})
//	defer b.Close(context.Background()) // closes the session: standbys take over at once
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "leader"})
//
// A JVM service joins with new LeaderLatch(curator, "/services/billing/leader", id).
// Lease names must not contain "/". The derivations, SUSPENDED and LOST,
// ACLs, TLS and sharing a connection (New with a SessionProbe and Watches) are in
// docs/backends/zookeeper.md.
package zookeeper
