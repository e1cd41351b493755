package raft

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
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
	const leases = 1000
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []error
	)
	for i := range leases {
		wg.Go(func() {
			if _, err := b.Campaign(ctx, fmt.Sprintf("burst-%04d", i), baton.Candidate{ID: "x"}); err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Errorf("%d of %d campaigns for free leases failed; the first: %v", len(failures), leases, failures[0])
	}
	// maxForwarded calls, connections net/http dialled for calls that an
	// idle one freed meanwhile, renewals, the raft transport's and those
	// the other members opened: far below one per campaign.
	t.Logf("peak connections: %d", gt.peakConns())
	if peak := gt.peakConns(); peak > 2*maxForwarded {
		t.Errorf("the member had %d connections open at once; want at most %d", peak, 2*maxForwarded)
	}
}
