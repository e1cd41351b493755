package raft

import (
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// TestManyCampaignsAtOnceKeepFewConnections: a member that is not the
// raft leader, campaigning for many leases at once (a balance instance
// starting with thousands), forwards its calls to the raft leader over a
// bounded number of connections, each of which costs a TLS handshake and
// a proof of the secret, and every campaign still wins.
func TestManyCampaignsAtOnceKeepFewConnections(t *testing.T) {
	g := newTestGroup(t, 3)
	gt := &gate{}
	n := g.start(t, func(o *NodeOptions) { o.gate = gt })
	g.waitJoined(t)
	b := newBackend(t, n, backend.Config{TTL: 3 * time.Second})
	testkit.CampaignBurst(t, b, "burst", "x", 1000, 2*time.Minute)
	// maxForwarded calls, connections net/http dialled for calls that an
	// idle one freed meanwhile, renewals, the raft transport's and those
	// the other members opened: far below one per campaign.
	t.Logf("peak connections: %d", gt.peakConns())
	if peak := gt.peakConns(); peak > 2*maxForwarded {
		t.Errorf("the member had %d connections open at once; want at most %d", peak, 2*maxForwarded)
	}
}
