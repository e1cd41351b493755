// Package zookeeper runs baton leases on Apache ZooKeeper (3.5 or later),
// using the node layout of Apache Curator's LeaderLatch recipe, so that Go
// services on baton and JVM services on Curator can share one election.
//
// # What is guaranteed, and what is not
//
// Each Backend rides on one ZooKeeper session, and every baton lease it
// campaigns for rides on that session: a process sends one renewal per
// RenewInterval however many leases it holds, and, on a connection dialed
// through a SessionProbe (as Dial's are), no pings besides while renewals
// flow. Lease NAME has the latch path
// Root + "/" + NAME (Root is "/baton" by default), and a candidate's claim
// on it is an ephemeral sequential child
//
//	_c_<UUID>-latch-<sequence>
//
// holding the candidate ID as its data: Curator's protected "latch-" node.
// The candidate whose node sorts first by sequence (as Curator sorts: the
// text after the last "latch-") holds the lease; every other waits,
// watching only the node just before its own, so a departure wakes one
// waiter, not the herd.
//
//   - Fencing tokens. Term.Token is the epoch<<32 plus the czxid of the
//     holder's node, the ZooKeeper transaction that created it. Transaction
//     IDs only grow, and a node comes first only after every older node of
//     the latch is gone, so tokens strictly increase across the terms of a
//     lease, whoever holds them, Curator's candidates included. The epoch,
//     the persistent node Root + "/.baton-epoch" (see EpochPath), keeps them
//     rising when ZooKeeper loses its data and its zxids start again, if
//     the new epoch's creator has a clock a second past the old epoch.
//   - Takeover only after the server says so. A candidate takes over only
//     when the nodes before its own are gone: deleted by their holder's
//     Resign or Close, by an operator, or by ZooKeeper when it expires the
//     holder's session, which it does no sooner than a full session timeout
//     after it last heard from the holder's client.
//   - Safe-until, measured from send time, less the ensemble lag. A
//     holder's term lasts until the time it sent its last request whose
//     reply confirmed the session, minus the ensemble lag, plus the
//     session timeout, minus DriftMargin. The request is a sync, not a
//     read: a follower answers reads from its own copy for a while after
//     it lost the leader, which expires sessions, whereas a sync passes
//     through the leader, which checks the session first. Even so, the
//     leader does not see a client's requests when the client is connected
//     to a follower: the follower tells it which sessions it heard from in
//     its replies to the leader's pings, every half tick. Should the
//     follower lose the leader just after it answered a renewal, the
//     leader's last word of the client may be the request before it. The
//     ensemble lag bounds that: RenewInterval (renewals are never further
//     apart) plus half a tick, which is at most a quarter of the session
//     timeout (a timeout is at least minSessionTimeout, two ticks by
//     default). So with the defaults (TTL 10 s, RenewInterval TTL/6,
//     DriftMargin TTL/10) a confirmed renewal keeps the terms safe for
//     4.8 s after its send time, and the next renewal is due 1.7 s later.
//     A standalone server has no lag, but a client cannot tell. At the
//     deadline the term ends with baton.ErrExpired, whether or not
//     ZooKeeper can be reached; this costs no failover time, since a
//     takeover waits for the server either way. The session timeout is the
//     one the server negotiated, which may differ from the TTL asked for
//     (ZooKeeper clamps it into [minSessionTimeout, maxSessionTimeout], 4 s
//     to 40 s with the default 2 s tick); Dial learns it through a
//     SessionProbe, New does through Options.Probe and otherwise takes the
//     TTL on trust. Should a reconnection be granted a shorter timeout (a
//     server of the ensemble configured differently), the terms end at the
//     next renewal, since what they were promised may outlast the session.
//   - Loss is reported. When the server expires the session, or the
//     holder's node is deleted, the term ends with baton.ErrLeaseLost.
//
// What it does not guarantee:
//
//   - Deletion by hand is not instantaneous for the holder. After
//     `zkCli.sh delete` of the holder's node the next candidate may take
//     over at once, while the old holder learns of it only when the watch
//     event reaches it, a network round trip later. The same is true of any
//     process paused (by GC, SIGSTOP, a VM migration) between checking its
//     leadership and writing. Only fencing closes these gaps: send
//     Term.Token with every write downstream and have the downstream store
//     reject a token lower than the highest it has seen.
//   - A killed holder is replaced after the session timeout plus up to one
//     server tick (ZooKeeper expires sessions on tick boundaries), not after
//     exactly the TTL.
//   - Leader reports ZooKeeper's view: the candidate whose node sorts
//     first, as Curator's getLeader does. Right after a holder stopped at its
//     safe-until that may still be the stopped holder, until its node is
//     deleted. ZooKeeper records when a node was created, not when it came
//     first, so Record.Since is always the zero time.
//   - Curator's candidates keep Curator's timing rules: baton's safe-until
//     covers baton's candidates only. Curator's default (see below) stops a
//     leader as soon as its connection is lost, which is safe; a Curator
//     client set to SessionConnectionStateErrorPolicy leads on until it
//     declares the session lost on its own clock, which can be later than
//     the server expired it.
//   - A create whose reply is lost (the connection fails mid-request) is
//     resolved as Curator resolves it: by listing the latch's children for
//     the node's protected prefix after a sync. In an ensemble, a create
//     still in flight on another server when the listing runs could land
//     after it; that node would belong to nobody here and lead with nobody
//     acting until the session ends. That costs liveness, never safety.
//
// # Lease state
//
// Terms implement baton.StateTerm: each lease keeps one small value
// (baton.MaxStateSize bytes at most), shared by all its terms, in the
// persistent node
//
//	Root + "/.baton-state/" + NAME       (Backend.StatePath)
//
// beside the latch paths, not under one: Curator's LeaderLatch takes every
// child of a latch path for a participant. ".baton-state" is therefore
// refused as a lease name and as a segment of Root, so that no latch path
// can coincide with the state tree or lie inside it; a Curator latch given
// such a path by hand would see the state nodes as candidates. The state
// nodes and any missing parent get Options.ACL, the parents as containers.
//
//   - Fenced by the store. StoreState is one multi: a check that the
//     term's latch node exists, and the write of the state node. A latch
//     node that came first stays first while it exists (later nodes get
//     higher sequence numbers), so ZooKeeper applies the write only while
//     the term holds the lease in its view, whatever the holder's clock
//     says. When the check fails, the term ends with baton.ErrLeaseLost
//     and the state is unchanged; a holder paused and replaced cannot
//     overwrite what its successor stored. A StoreState whose reply is
//     lost returns an error wrapping baton.ErrBackendUnavailable: it may
//     still land, fenced all the same.
//   - LoadState syncs before it reads, so that it sees every write
//     confirmed before it began, even on a lagging follower.
//   - State outlives terms and is never deleted by the Backend: remove
//     the node by hand when a lease is retired.
//
// # Connection loss: SUSPENDED and LOST
//
// Curator names two connection states. SUSPENDED: the client lost its
// connection, and the session may still be alive. LOST: the session expired
// (or, in Curator 5, the client gave up on it after a session timeout).
// Curator's LeaderLatch, with its default StandardConnectionStateErrorPolicy,
// treats SUSPENDED as a loss of leadership at once, and looks again when the
// client RECONNECTS.
//
// baton does better than that while staying safe. When the connection is
// lost (SUSPENDED), a term continues until its safe-until, which lies
// before the moment the server could expire the session; the holder keeps
// acting meanwhile. If the client reconnects to the still-valid session in
// time, renewals resume and the term carries on with the same token. If
// safe-until passes first, the term ends with baton.ErrExpired; the session
// may still be alive, so once the client is back the Backend deletes the
// stopped term's node (others may take over then rather than at the
// session's expiry) and later campaigns start afresh on that session. When
// the server expired the session (LOST), terms end with baton.ErrLeaseLost,
// the client opens a new session, and later campaigns use it.
//
// # Authentication, ACLs and TLS
//
// Options.ACL is given to every node the Backend creates, the latch nodes,
// the state nodes and any missing parent (as containers, as Curator
// creates them); the default is open, as Curator's. With DialOptions.Digest ("user:password")
// the session authenticates under ZooKeeper's digest scheme, and an ACL
// such as
//
//	append(zk.DigestACL(zk.PermAll, "svc", "secret"), zk.WorldACL(zk.PermRead)...)
//
// keeps other clients from deleting the nodes (ZooKeeper checks deletion
// against the parent's ACL, which the Backend sets when it creates the
// latch path) while letting anyone watch who leads. Parents that exist
// already keep their ACL. DialOptions.TLS connects to the servers'
// secureClientPort; a client certificate in it also authenticates the
// session where the server enables the x509 scheme. For New, configure
// the connection yourself (zk.WithDialer, conn.AddAuth).
//
// # Using it
//
//	b, err := zookeeper.Dial(ctx, []string{"zk1:2181", "zk2:2181", "zk3:2181"}, zookeeper.DialOptions{
//		Options: zookeeper.Options{Config: baton.Config{TTL: 10 * time.Second}, Root: "/services/billing"},
//	})
//	...
//	defer b.Close(context.Background()) // closes the session: standbys take over at once
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "leader"})
//
// A JVM service joins the same election with
//
//	new LeaderLatch(curator, "/services/billing/leader", id)
//
// (Backend.LatchPath gives the path), and each side's getLeader / Leader
// reports the other's candidate ID while it leads. Lease names must not
// contain "/": latch "a/b" would be a child of latch "a", which both baton
// and Curator would count as a candidate of "a". Put shared path segments in
// Options.Root instead.
//
// To share a connection with other code, make it with a SessionProbe and
// hand both to New; Close then deletes the Backend's nodes and leaves the
// connection open:
//
//	probe := zookeeper.NewSessionProbe(nil)
//	conn, _, err := zk.Connect(servers, 10*time.Second, zk.WithDialer(probe.Dial))
//	b, err := zookeeper.New(conn, zookeeper.Options{Config: baton.Config{TTL: 10 * time.Second}, Probe: probe})
package zookeeper
