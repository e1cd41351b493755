package raft

import (
	"context"
	"slices"
	"time"

	hraft "github.com/hashicorp/raft"
)

// catchUpWait bounds how long a removal waits for the voters that stay to
// hold the current configuration (see votersCaughtUp).
const catchUpWait = 3 * time.Second

// votersCaughtUp waits, up to catchUpWait, until every voter of the
// current configuration other than this member and removing reports a
// last log index at or past this member's last one (so past the
// configuration's entry), and returns the voters still behind then.
//
// hashicorp/raft refuses a vote, and a pre-vote, from a server missing from
// the voter's latest configuration. A voter that lags behind the entry that
// made another member a voter (after a partition healed, say) would refuse
// that member's candidacy; should the raft leader crash once removing has
// gone, those two could be all that is left of a quorum, and would elect
// nobody, ever. Waiting for the lagging voter before the removal closes
// that window in all but the case where it does not catch up in time.
func (n *Node) votersCaughtUp(removing hraft.ServerID) []hraft.ServerID {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	// The leader's last entry is at or past the configuration's own (the
	// future does not say which entry that is).
	index := n.raft.LastIndex()
	var behind []hraft.Server
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == hraft.Voter && s.ID != removing && string(s.ID) != n.id {
			behind = append(behind, s)
		}
	}
	deadline := time.Now().Add(catchUpWait)
	for len(behind) > 0 && time.Now().Before(deadline) {
		behind = slices.DeleteFunc(behind, func(s hraft.Server) bool {
			ctx, cancel := context.WithTimeout(n.ctx, 500*time.Millisecond)
			defer cancel()
			var in nodeInfo
			err := n.client.call(ctx, string(s.Address), "/v1/raft/info", nil, &in, false)
			return err == nil && in.ID == string(s.ID) && in.LastIndex >= index
		})
		if len(behind) > 0 && !n.sleep(50*time.Millisecond) {
			break
		}
	}
	ids := make([]hraft.ServerID, len(behind))
	for i, s := range behind {
		ids[i] = s.ID
	}
	return ids
}

// removeServer removes id from the group's configuration once the voters
// that stay hold the current one (votersCaughtUp), or catchUpWait passed.
func (n *Node) removeServer(id hraft.ServerID) error {
	if behind := n.votersCaughtUp(id); len(behind) > 0 {
		n.log.Warn("removing a member while voters are behind the group's configuration: should the raft leader crash before they catch up, they may refuse to elect a newer voter",
			"removing", id, "behind", behind)
	}
	return n.await(n.raft.RemoveServer(id, 0, 5*time.Second))
}
