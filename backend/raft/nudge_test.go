package raft

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// TestFollowersLearnCommitsFromTheNudge: a follower learns of each
// committed change (here an election and a release with nobody waiting,
// which hands the lease to no one) from the no-op the raft leader appends
// after it, not from raft's CommitTimeout, which is long (half the
// heartbeat timeout) so that an idle group costs little. At a heartbeat
// timeout of 6 s the CommitTimeout sends nothing for at least 3 s; the
// follower's watcher must see each event sooner than that. Without the
// no-op after every change (only after a promotion), the release reaches
// the follower only with the CommitTimeout's AppendEntries.
func TestFollowersLearnCommitsFromTheNudge(t *testing.T) {
	const heartbeat = 6 * time.Second
	g := newTestGroup(t, 3, func(o *NodeOptions) {
		o.HeartbeatTimeout = heartbeat
		o.DeadServerAfter = 4 * heartbeat
		o.RecoverAfter = 4 * heartbeat
	})
	var leader, follower *Node
	testkit.Eventually(t, 4*heartbeat, "a raft leader", func() bool { leader = g.leader(); return leader != nil })
	for _, n := range g.members() {
		if n != leader {
			follower = n
			break
		}
	}
	evs := watchEvents(t, follower)
	b := newBackend(t, leader, backend.Config{TTL: 5 * heartbeat})
	// Below the CommitTimeout's shortest wait (heartbeat/2), with room for
	// a loaded machine.
	const within = heartbeat/2 - 500*time.Millisecond
	lease := testkit.Unique("nudge")
	term := testkit.CampaignWithin(t, b, lease, "a", 4*heartbeat)
	if !testkit.Poll(within, 10*time.Millisecond, func() bool { _, ok := evs.find(lease, EventElected, "a"); return ok }) {
		t.Fatalf("the follower did not see the election within %s: %q", within, evs.of(lease))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*heartbeat)
	defer cancel()
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(within, 10*time.Millisecond, func() bool { _, ok := evs.find(lease, EventReleased, "a"); return ok }) {
		t.Fatalf("the follower did not see the release within %s: %q", within, evs.of(lease))
	}
}
