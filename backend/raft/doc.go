// Package raft is baton's embedded default: the instances of a service elect
// among themselves, with no coordination service to run. Each instance runs a
// member (a Node) of one hashicorp/raft group; leases and sessions live in the
// replicated log.
//
// Everything package baton guarantees holds here, given a majority of the
// voters alive and connected:
//
//   - Fencing tokens are the group's epoch<<32 plus the log index of the
//     entry that granted the term: they strictly increase, also across a
//     group formed anew after the old one died.
//   - A renewal is confirmed only after the raft leader has checked with a
//     quorum that it still leads, and sessions are expired only by the raft
//     leader's timers; a new raft leader times them from the last moment a
//     quorum heard from the old one, so no leader expires a session before
//     its holder's safe-until. Leader is linearizable (Options.StaleReads trades that for
//     a local read).
//   - StoreState is a log command applied only while the term's session and
//     token still hold the lease. A requested resign (Node.RequestResign)
//     closes the term's ResignRequested channel and releases only when the
//     holder resigns.
//   - An agent client (Client, through a member's ClientHandler) acts only on
//     its own session, and only members that prove the group's secret after
//     mutual TLS reach the log.
//
// Not done: a minority of the voters elects no one, so a group needs 3 (or
// 5) voters for one (or two) failures, and two instances need a third,
// Witness member. A group that lost its majority recovers only when
// NodeOptions.Terminations proves the lost voters gone for good (EC2:
// terminated) or on an operator's word (RequestRecovery, `baton raft
// recover`), with a new epoch and no grant until MaxTTL has passed
// (docs/backends/raft.md); a crashed holder that was also the raft leader fails over
// after about TTL + half a heartbeat timeout (5.6 s at the defaults), or
// after the raft election if that takes longer; members must reach each
// other directly.
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
// The derivations, operating the group (Leases, WatchLeases, RequestResign,
// `baton agent`) and membership are in docs/backends/raft.md.
package raft
