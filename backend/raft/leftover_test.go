package raft

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// A term whose release did not land (Resign with a context already ended:
// the release is never sent) leaves the lease to its session in the log.
// The next campaign of the same Backend must not be handed that term's
// token again, as a retried acquire would be: it gives the lease back and
// wins a token of its own.
func TestLeftoverTermGetsNoSecondTerm(t *testing.T) {
	g := newTestGroup(t, 3)
	readyLeaderOf(t, g)
	b := newBackend(t, g.members()[1], backend.Config{TTL: 2 * time.Second})
	ctx, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	// A release with an ended context is usually never sent; on the raft
	// leader it may still be applied. Until one did not land:
	var first baton.Term
	for try := 0; ; try++ {
		if try == 20 {
			t.Fatal("20 releases with an ended context all landed: the case is not reached")
		}
		first = testkit.CampaignWithin(t, b, "job", "a", 20*time.Second)
		_ = first.Resign(ended)
		rec, err := b.Leader(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Token == first.Token() {
			break
		}
	}
	second := testkit.CampaignWithin(t, b, "job", "a", 20*time.Second)
	if second.Token() <= first.Token() {
		t.Fatalf("the second term has token %d, not above the first term's %d", second.Token(), first.Token())
	}
	if err := second.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
