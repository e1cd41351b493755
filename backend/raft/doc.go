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
//   - Fencing tokens strictly increase: a term's token is the raft log index
//     of the entry that granted it.
//   - A holder stops acting at safe-until (the send time of its last
//     confirmed renewal + TTL − drift margin). A renewal is confirmed only
//     after the raft leader has checked with a quorum that it still leads, so
//     a raft leader deposed by a partition cannot extend a lease.
//   - Sessions are expired only by the raft leader, a TTL after the last
//     renewal it confirmed, on its monotonic clock; a newly elected raft
//     leader restarts every session's timer at a full TTL. No leader can
//     therefore expire a session before its holder's safe-until.
//   - Leader is linearizable: it reads through the raft leader after the
//     same quorum check (Options.StaleReads trades that for a local read).
//
// What it does not do: a minority of the voters elects no one and grants
// nothing, so a group needs 3 (or 5) voters for one (or two) failures; two
// application instances need a third, Witness member. A crashed process that
// was also the raft leader costs a raft election (about one to two
// heartbeat timeouts) on top of the TTL. Members must reach each other
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
