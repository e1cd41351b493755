package raft

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// TestTokensRiseAcrossGroupRestart is the attack of a whole in-memory group
// (the default) restarted: every member stopped, and a new group formed on
// the same addresses, its log starting again at index 1. The new group's
// first token must still be above the old group's last one.
func TestTokensRiseAcrossGroupRestart(t *testing.T) {
	cfg := backend.Config{TTL: 2 * time.Second}
	old := newTestGroup(t, 3)
	addrs := slices.Clone(old.addrs)
	b := newBackend(t, old.members()[0], cfg)
	var last uint64
	for i := range 5 {
		term := testkit.CampaignWithin(t, b, "job", "old", 20*time.Second)
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
	testkit.Eventually(t, 2*time.Second, "the wall clock to pass the old group's second", func() bool {
		return backend.EpochOf(time.Now()) > backend.EpochOf(lastAt)
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
	term := testkit.CampaignWithin(t, b2, "job", "new", 20*time.Second)
	if term.Token() <= last {
		t.Fatalf("the new group's first token is %d, not above the old group's last, %d", term.Token(), last)
	}
	t.Logf("old group's last token %d, new group's first %d", last, term.Token())
}

// TestEpochInTheLog: the first acquire sets the group's epoch from its
// time, every grant (an acquire, or a release handing the lease to a
// waiter) is epoch<<32 + its index, a snapshot carries the epoch, and an
// acquire that would set it without a time is refused.
func TestEpochInTheLog(t *testing.T) {
	f := newFSM()
	log := &testLog{t: t}
	apply := log.apply
	apply(f, command{Op: opSessionCreate, Session: "s1", Node: "n1", TTL: time.Second})
	apply(f, command{Op: opSessionCreate, Session: "s2", Node: "n2", TTL: time.Second})
	if r := apply(f, command{Op: opAcquire, Session: "s1", Lease: "job", Candidate: "a"}); r.Holder || r.Err != errNoEpoch {
		t.Fatalf("acquire without a time in a group without an epoch: %+v", r)
	}
	at := backend.EpochTime(1000)
	r := apply(f, command{Op: opAcquire, Session: "s1", Lease: "job", Candidate: "a", Time: at})
	if want := uint64(1000)<<32 + log.index; !r.Holder || r.Token != want {
		t.Fatalf("acquire: %+v, want token %d", r, want)
	}
	// A later acquire's time does not move the epoch.
	apply(f, command{Op: opAcquire, Session: "s2", Lease: "job", Candidate: "b", Time: at.Add(time.Hour)})
	apply(f, command{Op: opRelease, Session: "s1", Lease: "job", Token: r.Token})
	v, _ := f.lease("job", "")
	if want := uint64(1000)<<32 + log.index; v.Candidate != "b" || v.Token != want {
		t.Fatalf("after release: %+v, want b with token %d", v, want)
	}
	g := restored(t, f)
	apply(g, command{Op: opRelease, Session: "s2", Lease: "job", Token: v.Token})
	r = apply(g, command{Op: opAcquire, Session: "s1", Lease: "job", Candidate: "a", Time: at.Add(2 * time.Hour)})
	if want := uint64(1000)<<32 + log.index; !r.Holder || r.Token != want {
		t.Fatalf("acquire after restore: %+v, want token %d (the epoch from the snapshot)", r, want)
	}
}
