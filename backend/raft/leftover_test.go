package raft

import (
	"context"
	"errors"
	"log/slog"
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
	leftoverGetsNoSecondTerm(t, newBackend(t, aFollower(t, g), backend.Config{TTL: 2 * time.Second}))
}

// aFollower returns a member of g that is not its raft leader, whose
// commands travel to the raft leader (so a command with an ended context
// is not sent).
func aFollower(t *testing.T, g *testGroup) *Node {
	t.Helper()
	readyLeaderOf(t, g)
	n := followerOf(g)
	if n == nil {
		t.Fatal("the group has no follower")
	}
	return n
}

// The same through an agent client (agent://): the campaign and the
// release travel the client API, and the raft leader answers for the
// client's session. The raft leader, which the client tells the highest
// token it held, takes the leftover term for what it is, not for a group
// that lost its state (no "token not above one the client held" at Error).
func TestLeftoverTermGetsNoSecondTermAgentClient(t *testing.T) {
	recs := []*logRecorder{{}, {}, {}}
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) { o.Logger = slog.New(recs[i]) })
	c, err := Dial(serveClients(t, aFollower(t, g)), ClientOptions{Token: testClientToken, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	leftoverGetsNoSecondTerm(t, newBackend(t, c, backend.Config{TTL: 3 * time.Second}))
	for i, r := range recs {
		if r.sawPrefix(grantedLowMsg) {
			t.Errorf("member %d reported a token not above one the client held, for the client's own leftover term", i)
		}
	}
}

func leftoverGetsNoSecondTerm(t *testing.T, b *Backend) {
	t.Helper()
	// The case of a release that failed and was not yet retried.
	b.keepUnreleased = true
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
		if err != nil && !errors.Is(err, baton.ErrNoLeader) {
			t.Fatal(err)
		}
		if err == nil && rec.Token == first.Token() {
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

// A term whose release failed leaves the lease to its session in the log,
// and the session lives on (its Backend renews it for its other leases):
// the Backend retries the release in the background, so that the next
// candidate gets the lease soon, and from a release, not an expiry a TTL
// later (the TTL here is longer than the test waits).
func TestFailedReleaseIsRetried(t *testing.T) {
	g := newTestGroup(t, 3)
	cfg := backend.Config{TTL: 25 * time.Second}
	a := newBackend(t, aFollower(t, g), cfg)
	other := newBackend(t, g.members()[0], cfg)
	first := testkit.CampaignWithin(t, a, "job", "a", 20*time.Second)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := first.Resign(ended); err == nil {
		t.Fatal("Resign with an ended context returned nil: the release was not made to fail")
	}
	next := testkit.CampaignWithin(t, other, "job", "b", 10*time.Second)
	p, ok := next.(baton.PredecessorTerm).Predecessor()
	if !ok || p.Token != first.Token() || p.Ended != "resigned" {
		t.Fatalf("the next term's predecessor is %+v (known %v), want the first term (token %d), resigned", p, ok, first.Token())
	}
	if next.Token() <= first.Token() {
		t.Fatalf("the next term has token %d, not above the first's %d", next.Token(), first.Token())
	}
}
