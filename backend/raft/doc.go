// Package raft is baton's embedded default: the instances of a service elect
// among themselves, with no coordination service to run. Each instance runs a
// member (a Node) of one hashicorp/raft group; leases and sessions live in the
// replicated log.
//
// # Guarantees
//
// Everything package baton guarantees holds here, given a majority of the
// voters alive and connected:
//
//   - Fencing tokens strictly increase: a term's token is the group's epoch
//     (the wall-clock second of the first acquire in its log) << 32 plus
//     the raft log index of the entry that granted it, so a group formed
//     anew after the old one died gives higher tokens, as long as its
//     first acquire comes in a later second.
//   - A holder stops acting at safe-until (the send time of its last
//     confirmed renewal + TTL − drift margin). A renewal is confirmed only
//     after the raft leader has checked with a quorum that it still leads, so
//     a raft leader deposed by a partition cannot extend a lease.
//   - Sessions are expired only by the raft leader, a TTL after the last
//     renewal it confirmed, on its monotonic clock; a newly elected raft
//     leader times every session from the last moment a quorum of voters
//     heard from an earlier one, plus half a heartbeat timeout. No leader
//     can therefore expire a session before its holder's safe-until.
//   - Leader is linearizable: it reads through the raft leader after the
//     same quorum check (Options.StaleReads trades that for a local read).
//   - A term's state (baton.StateTerm) is stored by a log command that the
//     log applies only while the term's session and token still hold the
//     lease there, so a holder replaced while it was paused or cut off
//     cannot overwrite its successor's state: its StoreState fails with
//     baton.ErrLeaseLost and ends the term. LoadState reads through the raft
//     leader after the quorum check. The state outlives the lease's record
//     (the log forgets a lease nobody holds or waits for, never its state).
//   - A requested resign (Node.RequestResign) hands nothing over by itself:
//     it is a flag on the lease in the log. The holder's Backend learns of
//     it with its next renewal (at most RenewInterval later) and closes the
//     term's ResignRequested channel (baton.ResignRequestTerm); the term
//     goes on, renewed, while the holder stops its work. The holder then
//     resigns (an Elector does so once its callback returned), which ends
//     the term with an error wrapping baton.ErrResigned ("resign requested
//     via the group API") and releases; only then does the first waiter get
//     the lease. A holder that ignores the request, or never renews again,
//     keeps the lease until it resigns or its session expires. The flag
//     goes with the term: the next term starts without it.
//   - An agent client (Client, through a member's ClientHandler) may act
//     only on its own session: every call about it carries the session's
//     secret, which the raft leader checks against the digest in the log,
//     and the raft leader builds the log command. No raw command is taken
//     from outside, and members may not forward the raft leader's own
//     commands: sessions expire only by the raft leader's timers.
//   - Only members reach the log: every connection between members, raft's
//     own RPC streams and the group API alike, proves the group's secret
//     both ways after mutual TLS, bound to that TLS session, before anything
//     on it is served. A certificate of the group's CA without the secret
//     gets nothing. A member that the members of a live group refuse for
//     its secret gives up joining (Node.Failed; Node.Err wraps
//     ErrSecretRefused).
//
// What it does not do: a minority of the voters elects no one and grants
// nothing, so a group needs 3 (or 5) voters for one (or two) failures; two
// application instances need a third, Witness member. A crashed process that
// was also the raft leader costs half a heartbeat timeout on top of the TTL
// (the election runs meanwhile), or the election if that takes longer.
// Members must reach each other
// directly (TCP, one port, mutual TLS).
//
// # Use
//
//	node, err := raft.StartNode(raft.NodeOptions{
//		BindAddr: "0.0.0.0:7390", AdvertiseAddr: "10.0.3.7:7390",
//		TLS: tlsConfig, Secret: secret,
//		Discovery: peers, BootstrapExpect: 3,
//	})
//	<-node.Joined()
//	backend, err := raft.New(node, raft.Options{})
//	defer node.Close(ctx)
//	defer backend.Close(ctx)
//
// # Operating the group
//
// A member also answers for the whole group, which `baton agent` serves
// over HTTP: Leases and Lease read the lease table through the raft leader,
// with each holder's SafeUntil as the raft leader's session timer has it;
// WatchLeases follows the lease events (queued, dequeued, elected,
// released, lost, with the reason) in log order as the member applies them;
// RequestResign asks a holder to step down; Determined says whether the
// member can currently answer at all (it knows a raft leader, which has a
// quorum). NodeOptions.OnRenew reports each renewal's round trip to the raft
// leader, for a metric.
//
// A process that should not be a member (a short-lived check, or one of many
// commands on a host) campaigns through a member's ClientHandler, served by
// `baton agent`, with a Client from Dial.
//
// # Membership
//
// A new group forms once BootstrapExpect members that have never been in a
// group see each other through Discovery; the lowest ID bootstraps it with
// the first Voters of them as voters. Later members join through any member
// as non-voters. raft-autopilot promotes healthy non-voters while fewer than
// Voters voters are healthy, and removes members the raft leader has not
// heard from for DeadServerAfter (never below Voters potential voters). A
// member that closes gracefully hands raft leadership on, has a caught-up
// non-voter promoted in its place, and leaves the configuration. A raft
// leader whose member holds a lease hands raft leadership to a caught-up
// voter that holds none, so that a crash of the holder costs the TTL but not
// also an election.
package raft
