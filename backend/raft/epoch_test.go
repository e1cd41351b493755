package raft

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/epoch"
)

// TestTokensRiseAcrossGroupRestart is the attack of a whole in-memory group
// (the default) restarted: every member stopped, and a new group formed on
// the same addresses, its log starting again at index 1. The new group's
// first token must still be above the old group's last one.
func TestTokensRiseAcrossGroupRestart(t *testing.T) {
	cfg := baton.Config{TTL: 2 * time.Second}
	old := newTestGroup(t, 3)
	addrs := slices.Clone(old.addrs)
	b := newBackend(t, old.members()[0], cfg)
	var last uint64
	for i := range 5 {
		term := campaignWithin(t, b, "job", "old")
		if term.Token() <= last {
			t.Fatalf("term %d: token %d after %d", i, term.Token(), last)
		}
		last = term.Token()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := term.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	lastAt := time.Now()
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = b.Close(closeCtx)
	for _, n := range old.members() {
		if err := n.Close(closeCtx); err != nil {
			t.Fatalf("close %s: %v", n.ID(), err)
		}
		old.forget(n)
	}
	// The documented assumption: the new group is created in a later
	// second (by the wall clock) than the old one. A real restart of a
	// whole group takes longer than that by itself; here it may not.
	eventually(t, 2*time.Second, "the wall clock to pass the old group's second", func() bool {
		return epoch.Of(time.Now()) > epoch.Of(lastAt)
	})

	g := newBareGroup(t)
	for _, a := range addrs {
		g.start(t, func(o *NodeOptions) {
			o.BindAddr = a
			o.BootstrapExpect, o.Voters = len(addrs), len(addrs)
		})
	}
	g.waitJoined(t)
	b2 := newBackend(t, g.members()[1], cfg)
	term := campaignWithin(t, b2, "job", "new")
	if term.Token() <= last {
		t.Fatalf("the new group's first token is %d, not above the old group's last, %d", term.Token(), last)
	}
	t.Logf("old group's last token %d, new group's first %d", last, term.Token())
}
