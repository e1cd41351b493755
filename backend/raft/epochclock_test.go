package raft

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// Messages of the reports the tests wait for (their start).
const (
	epochAheadMsg = "the group's epoch is ahead of this member's wall clock"
	grantedLowMsg = "granted a fencing token not above one the client held"
	heldHigherMsg = "granted a fencing token not above one this process held"
)

// sawPrefix reports whether r kept a message starting with prefix.
func (r *logRecorder) sawPrefix(prefix string) bool {
	return slices.ContainsFunc(r.messages(), func(m string) bool { return strings.HasPrefix(m, prefix) })
}

// TestMemberBehindEpochSaysSo: in a real three-member group, the member
// whose wall clock is an hour behind learns the epoch that a member with a
// good clock set (its first acquire), and reports at Error that the epoch is
// ahead of its clock: should the whole group lose its state and this member
// start the next, tokens would go down. The members with good clocks say
// nothing.
func TestMemberBehindEpochSaysSo(t *testing.T) {
	recs := []*logRecorder{{}, {}, {}}
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		o.Logger = slog.New(recs[i])
		if i == 2 {
			o.wallClock = behind
		}
	})
	nodes := g.members()
	// The acquire is proposed through a member with a good clock, whose
	// clock sets the epoch.
	b := newBackend(t, nodes[0], backend.Config{TTL: 2 * time.Second})
	testkit.CampaignWithin(t, b, "job", "a", 20*time.Second)
	testkit.Eventually(t, 20*time.Second, "the member an hour behind to report the epoch ahead of its clock", func() bool {
		return recs[2].sawPrefix(epochAheadMsg)
	})
	for i := range 2 {
		if recs[i].sawPrefix(epochAheadMsg) {
			t.Errorf("member %d, whose clock is right, reported the epoch ahead of its clock", i)
		}
	}
}

// TestLowerTokensAfterGroupRestartAreReported is the attack of a group that
// lost its state (every member in memory, all stopped) and was started
// again by members whose wall clocks are an hour behind: the new group's
// tokens are below the old group's. An agent client that held a token of
// the old group and survived the restart (its agent's address stays; the
// group behind it is new) is granted a lower one: the client reports it,
// and so does the raft leader that granted it, which the client told.
func TestLowerTokensAfterGroupRestartAreReported(t *testing.T) {
	cfg := backend.Config{TTL: 2 * time.Second}
	old := newTestGroup(t, 3)
	// The agent's client API, served by whichever group's member it is
	// pointed at: the client keeps one address across the restart.
	var handler atomic.Pointer[http.Handler]
	setAgent := func(n *Node) {
		h, err := n.ClientHandler(testClientToken)
		if err != nil {
			t.Fatal(err)
		}
		handler.Store(&h)
	}
	agent := testkit.ServeHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*handler.Load()).ServeHTTP(w, r)
	}))
	setAgent(old.members()[0])
	c, err := Dial(agent, ClientOptions{Token: testClientToken, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	clientLog := &logRecorder{}
	b, err := New(c, Options{Config: cfg, Logger: slog.New(clientLog)})
	if err != nil {
		t.Fatal(err)
	}
	b = testkit.CloseAtEnd(t, b, 3*time.Second)
	term := testkit.CampaignWithin(t, b, "job", "a", 20*time.Second)
	last := term.Token()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range old.members() {
		if err := n.Close(ctx); err != nil {
			t.Fatalf("close %s: %v", n.ID(), err)
		}
		old.forget(n)
	}

	recs := []*logRecorder{{}, {}, {}}
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		o.Logger = slog.New(recs[i])
		o.wallClock = behind
	})
	setAgent(g.members()[0])
	term = testkit.CampaignWithin(t, b, "job", "a", 30*time.Second)
	if term.Token() >= last {
		t.Fatalf("the new group's token %d is not below the old group's %d: the attack did not take place", term.Token(), last)
	}
	testkit.Eventually(t, 10*time.Second, "the client to report the lower token", func() bool {
		return clientLog.sawPrefix(heldHigherMsg)
	})
	testkit.Eventually(t, 10*time.Second, "the raft leader that granted it to report it", func() bool {
		return slices.ContainsFunc(recs, func(r *logRecorder) bool { return r.sawPrefix(grantedLowMsg) })
	})
	t.Logf("old group's last token %d, new group's first %d", last, term.Token())
}
