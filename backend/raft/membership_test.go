package raft

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testkit"
	hraft "github.com/hashicorp/raft"
)

// These tests run real members on loopback (see raft_test.go). They wait
// by polling state with eventually, never by sleeping; the few checks that
// something does NOT happen watch it for a bounded window (neverWithin).

// TestReplaceVotersOneByOne replaces every member of a 3-voter group, one
// at a time, alternating graceful leaves and crashes, while a lease stays
// held on some live member: the rolling replacement of an Auto Scaling
// group. The lease follows the oldest surviving member, so it is handed
// over both by a graceful close and by a crash.
func TestReplaceVotersOneByOne(t *testing.T) {
	g := newTestGroup(t, 3, busyHostTiming)
	readyLeaderOf(t, g)
	cfg := backend.Config{TTL: DefaultTTL}
	live := g.members() // oldest first: the oldest is stopped next
	var originals []string
	for _, n := range live {
		originals = append(originals, n.ID())
	}

	// The holder sits on the second-oldest member: it keeps the lease
	// through round 0 and loses its member in round 1 (a crash).
	h := holding{node: live[1], b: newBackend(t, live[1], cfg)}
	h.term = campaignWithin(t, h.b, "job", h.node.ID(), 20*time.Second)

	const rounds = 4
	for round := range rounds {
		crash := round%2 == 1
		how := map[bool]string{false: "close", true: "kill"}[crash]

		fresh := g.start(t)
		joinedWithin(t, fresh, 30*time.Second)
		old := live[0]
		live = append(slices.Clone(live[1:]), fresh)
		t.Logf("round %d: %s joined; %s %s (raft leader: %v, holds the lease: %v)",
			round, fresh.ID(), how, old.ID(), old.isReady(), old == h.node)

		if old == h.node {
			// Hand the lease to the oldest survivor, which a later round
			// stops in turn.
			h = handOff(t, h, live[0], crash, cfg)
		} else {
			stopMember(t, old, crash)
		}
		g.forget(old)

		// Autopilot settles: the stopped member is out of the
		// configuration (it left, or was removed as dead) and the new one
		// was promoted, so the group is the live members, all voters.
		waitState(t, 30*time.Second, fmt.Sprintf("round %d: configuration is the 3 live members, all voters", round), func() (bool, string) {
			return settledOn(g, live)
		})
		if st := readyLeaderOf(t, g).Status(); len(st.Voters) != 3 {
			t.Fatalf("round %d: voters %v, want 3", round, st.Voters)
		}

		// The holder kept its term through a graceful leave elsewhere. A
		// crash of the raft leader costs an election, which the TTL
		// rides out in practice; should it not, the holder must at least
		// win the lease back.
		if err := h.term.Err(); err != nil {
			if !crash {
				t.Fatalf("round %d: the holder on %s lost its term though %s left gracefully: %v", round, h.node.ID(), old.ID(), err)
			}
			t.Logf("round %d: the holder lost its term in the crash (%v); campaigning again", round, err)
			h.term = campaignWithin(t, h.b, "job", h.node.ID(), 20*time.Second)
		}
		assertHolder(t, h.b, "job", h.node.ID(), h.term.Token())

		// A brand-new member (promoted to voter this round) serves
		// campaigns and reads.
		probeLease(t, fresh, fmt.Sprintf("round-%d", round), cfg)
	}

	// Every original member is gone, from the configuration too.
	for _, s := range serversOf(readyLeaderOf(t, g)) {
		if slices.Contains(originals, string(s.ID)) {
			t.Fatalf("original member %s is still in the configuration", s.ID)
		}
	}
}

// campaignWithin is testkit.CampaignWithin that campaigns again after a
// campaign fails with baton.ErrBackendUnavailable, as an Elector does,
// until d has passed: on a loaded machine a stall of the test process can
// keep the group from confirming a new session's renewal in time, which
// Campaign reports as an outage to retry, not as a failure of what the
// tests check.
func campaignWithin(t testing.TB, b baton.Backend, lease, id string, d time.Duration) baton.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	for {
		term, err := b.Campaign(ctx, lease, baton.Candidate{ID: id})
		switch {
		case err == nil:
			return term
		case errors.Is(err, baton.ErrBackendUnavailable) && ctx.Err() == nil:
			t.Logf("%s campaigning for %s: %v; campaigning again", id, lease, err)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		default:
			t.Fatalf("%s campaigning for %s: %v", id, lease, err)
		}
	}
}

// busyHostTiming gives a member the product's default heartbeat timeout,
// which rides out the stalls of a process starved of CPU (see
// DefaultHeartbeatTimeout), and the shortest DeadServerAfter it allows.
// It is for tests that assert that a term survives: on a loaded machine
// the group's 200 ms heartbeat timeout turns each longer stall of the
// test process into an election, and a run of them lets a holder's
// session expire whatever the test does.
func busyHostTiming(o *NodeOptions) {
	o.HeartbeatTimeout = DefaultHeartbeatTimeout
	o.DeadServerAfter = 2 * DefaultHeartbeatTimeout
}

// probeLease campaigns for name through a new Backend on n, reads it
// back, and gives it up.
func probeLease(t *testing.T, n *Node, name string, cfg backend.Config) {
	t.Helper()
	b := newBackend(t, n, cfg)
	term := campaignWithin(t, b, name, n.ID(), 20*time.Second)
	assertHolder(t, b, name, n.ID(), term.Token())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := term.Resign(ctx); err != nil {
		t.Fatalf("resign %q: %v", name, err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatalf("close the backend on %s: %v", n.ID(), err)
	}
}

// holding is a Backend on a member and the term it holds.
type holding struct {
	node *Node
	b    *Backend
	term baton.Term
}

// handOff stops h's member (its Backend first, as a graceful process
// would, or with it, as a crash would) and has a new Backend on next win
// the lease. After a crash the lease must not be won before the old
// term's safe-until: that is the guarantee holders rely on.
func handOff(t *testing.T, h holding, next *Node, crash bool, cfg backend.Config) holding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !crash {
		if err := h.b.Close(ctx); err != nil {
			t.Fatalf("close the holder's backend: %v", err)
		}
		if err := h.term.Err(); !errors.Is(err, baton.ErrClosed) {
			t.Fatalf("old term after Close: %v, want ErrClosed", err)
		}
	}
	stopMember(t, h.node, crash)
	nb := newBackend(t, next, cfg)
	nt := campaignWithin(t, nb, h.name(), next.ID(), 20*time.Second)
	won := time.Now()
	if crash {
		select {
		case <-h.term.Done():
		case <-time.After(2 * cfg.TTL):
			t.Fatalf("the crashed member's term did not end by itself")
		}
		if won.Before(h.term.SafeUntil()) {
			t.Fatalf("lease won %s before the crashed holder's safe-until", h.term.SafeUntil().Sub(won))
		}
		_ = h.b.Close(ctx) // its member is gone: nothing to destroy
	}
	if nt.Token() <= h.term.Token() {
		t.Fatalf("new token %d not above the old %d", nt.Token(), h.term.Token())
	}
	return holding{node: next, b: nb, term: nt}
}

func (h holding) name() string { return h.term.Lease() }

// stopMember closes n gracefully, or kills it.
func stopMember(t *testing.T, n *Node, crash bool) {
	t.Helper()
	if crash {
		if err := n.Kill(); err != nil {
			t.Fatalf("kill %s: %v", n.ID(), err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		t.Fatalf("close %s: %v", n.ID(), err)
	}
}

// TestLeadershipTransferOnClose closes the raft leader of a group of three
// voters and a non-voter: it hands leadership to a voter (one new term, no
// election timeout) and leaves the configuration.
func TestLeadershipTransferOnClose(t *testing.T) {
	recs := map[int]*logRecorder{}
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		recs[i] = &logRecorder{}
		o.Logger = slog.New(recs[i])
	})
	nodes := g.members()
	extra := g.start(t) // joins as a non-voter: the group has its 3
	joinedWithin(t, extra, 30*time.Second)
	waitState(t, 10*time.Second, "the fourth member is a non-voter", func() (bool, string) {
		l := g.leader()
		if l == nil {
			return false, "no ready leader"
		}
		for _, s := range serversOf(l) {
			if string(s.ID) == extra.ID() {
				return s.Suffrage == hraft.Nonvoter, fmt.Sprintf("%+v", serversOf(l))
			}
		}
		return false, fmt.Sprintf("not listed: %+v", serversOf(l))
	})

	old := readyLeaderOf(t, g)
	oldRec := recs[slices.Index(nodes, old)]
	votersBefore := old.Status().Voters
	termBefore := raftTermOf(t, old)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := old.Close(ctx); err != nil {
		t.Fatalf("close the raft leader: %v", err)
	}
	g.forget(old)
	if !oldRec.saw("handed raft leadership on") {
		t.Fatalf("the closing leader did not hand leadership on; it logged %q", oldRec.messages())
	}

	next := readyLeaderOf(t, g)
	if next == extra || !slices.Contains(votersBefore, next.ID()) {
		t.Fatalf("leadership went to %s, not one of the voters %v", next.ID(), votersBefore)
	}
	// A transfer makes its target campaign at once, in the next term; an
	// election after a timeout would have started with some follower
	// noticing the silence, and split votes would have cost more terms.
	if term := raftTermOf(t, next); term != termBefore+1 {
		t.Fatalf("raft term %d after the transfer, want %d (one more than %d)", term, termBefore+1, termBefore)
	}
	waitState(t, 10*time.Second, "the closed leader left the configuration", func() (bool, string) {
		l := g.leader()
		if l == nil {
			return false, "no ready leader"
		}
		srvs := serversOf(l)
		return !slices.ContainsFunc(srvs, func(s hraft.Server) bool { return string(s.ID) == old.ID() }), fmt.Sprintf("%+v", srvs)
	})
}

// TestWitness runs two application members and a witness: the witness
// joins as a voter, refuses Backends, hands raft leadership on, and keeps
// a quorum with the surviving application member when the other dies.
func TestWitness(t *testing.T) {
	g := newBareGroup(t)
	// A long stabilization time keeps autopilot from promoting anyone
	// during the test, so a witness in the voters joined as one.
	app := func(o *NodeOptions) { o.BootstrapExpect = 2; o.StabilizationTime = time.Minute }
	a := g.start(t, app)
	b := g.start(t, app)
	g.waitJoined(t)
	wrec := &logRecorder{}
	w := g.start(t, func(o *NodeOptions) {
		o.Witness = true
		o.StabilizationTime = time.Minute
		o.Logger = slog.New(wrec)
	})
	joinedWithin(t, w, 30*time.Second)
	waitState(t, 10*time.Second, "three voters, the witness among them", func() (bool, string) {
		l := g.leader()
		if l == nil {
			return false, "no ready leader"
		}
		st := l.Status()
		return len(st.Voters) == 3 && slices.Contains(st.Voters, w.ID()), fmt.Sprintf("%+v", st)
	})

	_, err := New(w, Options{})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("New on a witness: %v, want *baton.ConfigError", err)
	}

	// Give the witness raft leadership: it hands it straight on.
	if l := readyLeaderOf(t, g); l != w {
		if err := l.raft.LeadershipTransferToServer(hraft.ServerID(w.ID()), hraft.ServerAddress(w.Addr())).Error(); err != nil {
			t.Fatalf("transfer to the witness: %v", err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the witness took raft leadership and handed it on", func() bool {
		return wrec.saw("witness handing raft leadership on")
	})
	waitState(t, 10*time.Second, "an application member is the ready raft leader, not the witness", func() (bool, string) {
		l := g.leader()
		if l == nil {
			return false, "no ready leader"
		}
		return l != w && w.raft.State() != hraft.Leader, fmt.Sprintf("ready leader %s, witness %s", l.ID(), w.raft.State())
	})

	cfg := backend.Config{TTL: 2 * time.Second}
	ba, bb := newBackend(t, a, cfg), newBackend(t, b, cfg)
	ta := testkit.CampaignWithin(t, ba, "job", "a", 20*time.Second)
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	g.forget(a)
	tb := testkit.CampaignWithin(t, bb, "job", "b", 20*time.Second)
	won := time.Now()
	select {
	case <-ta.Done():
	case <-time.After(2 * cfg.TTL):
		t.Fatal("the killed member's term did not end by itself")
	}
	if won.Before(ta.SafeUntil()) {
		t.Fatalf("b won the lease %s before a's safe-until", ta.SafeUntil().Sub(won))
	}
	if tb.Token() <= ta.Token() {
		t.Fatalf("token %d not above %d", tb.Token(), ta.Token())
	}
	assertHolder(t, bb, "job", "b", tb.Token())
	if l := g.leader(); l == w {
		t.Fatalf("the witness is the ready raft leader after the kill")
	}
}

// TestJoinNeedsSecret starts a member with the group's CA but a wrong
// secret: it never gets in, gives up with ErrSecretRefused instead of
// retrying forever, and the members log the refusal with its address.
func TestJoinNeedsSecret(t *testing.T) {
	t.Parallel() // idle groups, and checks that hold under load
	for _, secretOnly := range []bool{false, true} {
		t.Run(modeName(secretOnly), func(t *testing.T) {
			t.Parallel()
			testJoinNeedsSecret(t, secretOnly)
		})
	}
}

func testJoinNeedsSecret(t *testing.T, secretOnly bool) {
	recs := make([]*attrRecorder, 3)
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		recs[i] = &attrRecorder{}
		o.Logger = slog.New(recs[i])
		secretOnlyIf(secretOnly)(o)
	})
	o := g.options(t)
	secretOnlyIf(secretOnly)(&o)
	o.Secret = "not-the-group-secret-0123456789"
	n := startOutsider(t, o)
	select {
	case <-n.Failed():
	case <-time.After(30 * time.Second):
		t.Fatalf("the member with a wrong secret did not give up: %+v", n.Status())
	}
	if err := n.Err(); !errors.Is(err, ErrSecretRefused) {
		t.Fatalf("Err() = %v, want ErrSecretRefused", err)
	}
	neverJoins(t, g, n)
	for i, r := range recs {
		var warned bool
		for _, rec := range r.all() {
			warned = warned || (rec.level >= slog.LevelWarn && rec.attrs["reason"] == "wrong secret" &&
				strings.HasPrefix(rec.attrs["peer"], "127.0.0.1:"))
		}
		if !warned {
			t.Errorf("member %d logged no refusal of the wrong secret with the peer's address: %+v", i, r.all())
		}
	}
}

// TestWrongSecretPeerStopsNobodyElse: while a group forms, a member with a
// wrong secret among the starting members refuses the others as they
// refuse it. The others must not take that for their own refusal: they
// form the group; only the odd one gives up.
func TestWrongSecretPeerStopsNobodyElse(t *testing.T) {
	t.Parallel() // idle groups, and checks that hold under load
	for _, secretOnly := range []bool{false, true} {
		t.Run(modeName(secretOnly), func(t *testing.T) {
			t.Parallel()
			testWrongSecretPeerStopsNobodyElse(t, secretOnly)
		})
	}
}

func testWrongSecretPeerStopsNobodyElse(t *testing.T, secretOnly bool) {
	g := newBareGroup(t)
	g.opt = append(g.opt, secretOnlyIf(secretOnly))
	wrong := g.start(t, func(o *NodeOptions) {
		o.BootstrapExpect, o.Voters = 2, 3
		o.Secret = "not-the-group-secret-0123456789"
	})
	a := g.start(t, func(o *NodeOptions) { o.BootstrapExpect, o.Voters = 2, 3 })
	// a sees only the odd one for a while: it refuses a, and a it.
	neverWithin(t, 2*time.Second, "a member gave up", func() (bool, string) {
		select {
		case <-a.Failed():
			return true, fmt.Sprintf("the member with the group's secret gave up: %v", a.Err())
		case <-wrong.Failed():
			return true, fmt.Sprintf("the odd member gave up before any group existed: %v", wrong.Err())
		default:
			return false, ""
		}
	})
	b := g.start(t, func(o *NodeOptions) { o.BootstrapExpect, o.Voters = 2, 3 })
	joinedWithin(t, a, 30*time.Second)
	joinedWithin(t, b, 30*time.Second)
	select {
	case <-wrong.Failed():
	case <-time.After(30 * time.Second):
		t.Fatalf("the member with a wrong secret did not give up once a group lived")
	}
	select {
	case <-a.Failed():
		t.Fatalf("a gave up: %v", a.Err())
	case <-b.Failed():
		t.Fatalf("b gave up: %v", b.Err())
	default:
	}
}

// TestJoinNeedsCertificateFromGroupCA starts a member with the group's
// secret but a certificate from another CA: it never gets in.
func TestJoinNeedsCertificateFromGroupCA(t *testing.T) {
	t.Parallel() // idle groups, and checks that hold under load
	g := newTestGroup(t, 3)
	other, err := certs.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	o := g.options(t)
	if o.TLS, err = other.Config("member", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	n := startOutsider(t, o)
	neverJoins(t, g, n)
}

// neverJoins watches n for a few seconds: its Joined stays open and no
// member's configuration lists it.
func neverJoins(t *testing.T, g *testGroup, n *Node) {
	t.Helper()
	neverWithin(t, 3*time.Second, "the outsider joined", func() (bool, string) {
		select {
		case <-n.Joined():
			return true, fmt.Sprintf("its Joined is closed: %+v", n.Status())
		default:
		}
		for _, m := range g.members() {
			for _, s := range serversOf(m) {
				if string(s.ID) == n.ID() || string(s.Address) == n.Addr() {
					return true, fmt.Sprintf("%s lists it: %+v", m.ID(), serversOf(m))
				}
			}
		}
		return false, ""
	})
}

// TestBootstrapExpectWaits: with BootstrapExpect 3, two members wait; the
// third forms one group of all three.
func TestBootstrapExpectWaits(t *testing.T) {
	t.Parallel() // idle groups, and checks that hold under load
	g := newBareGroup(t)
	expect3 := func(o *NodeOptions) { o.BootstrapExpect = 3 }
	a, b := g.start(t, expect3), g.start(t, expect3)
	// Ten heartbeat timeouts: a group would have elected a leader.
	neverWithin(t, 10*g.options(t).HeartbeatTimeout, "two of three members formed a group", func() (bool, string) {
		for _, n := range []*Node{a, b} {
			if addr, _ := n.raft.LeaderWithID(); addr != "" || n.raft.LastIndex() > 0 {
				return true, fmt.Sprintf("%+v", n.Status())
			}
		}
		return false, ""
	})
	c := g.start(t, expect3)
	g.waitJoined(t)
	want := []string{a.ID(), b.ID(), c.ID()}
	slices.Sort(want)
	waitState(t, 10*time.Second, "one group of all three, agreed by each", func() (bool, string) {
		var leader string
		var desc []string
		ok := true
		for _, n := range []*Node{a, b, c} {
			st := n.Status()
			desc = append(desc, fmt.Sprintf("%+v", st))
			voters := slices.Sorted(slices.Values(st.Voters))
			if st.Leader == "" || (leader != "" && st.Leader != leader) || !slices.Equal(voters, want) || len(st.Members) != 3 {
				ok = false
			}
			leader = st.Leader
		}
		return ok, strings.Join(desc, "\n")
	})
}

// TestRestartWithDataDir kills a voter that keeps its log in a data dir
// and restarts it on a new port: it comes back as the same member, with
// its log, and rejoins. A different explicit ID is refused.
func TestRestartWithDataDir(t *testing.T) {
	dir := t.TempDir()
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		if i == 0 {
			o.DataDir = dir
		}
	})
	m := g.members()[0]
	id := m.ID()
	if b, err := os.ReadFile(filepath.Join(dir, "node-id")); err != nil || strings.TrimSpace(string(b)) != id {
		t.Fatalf("node-id file: %q, %v; want %q", b, err, id)
	}

	other := g.members()[1]
	bo := newBackend(t, other, backend.Config{TTL: 2 * time.Second})
	held := testkit.CampaignWithin(t, bo, "job", "other", 20*time.Second)
	for i := range 3 {
		tm := testkit.CampaignWithin(t, bo, fmt.Sprintf("filler-%d", i), "other", 20*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := tm.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	target := other.raft.LastIndex()
	testkit.Eventually(t, 10*time.Second, "the data-dir member applied the log", func() bool {
		return m.raft.AppliedIndex() >= target
	})
	kept := m.raft.LastIndex()
	oldAddr := m.Addr()

	// The member comes back while another leads: the group's leader then
	// re-adds it at its new address. (Its winning the election on the way
	// back is TestRestartWithDataDirWinsElection.)
	moveLeadershipOff(t, g, m)

	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	g.forget(m)

	o := g.options(t)
	o.DataDir, o.ID = dir, "someone-else"
	if n, err := StartNode(o); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = n.Close(ctx)
		cancel()
		t.Fatalf("StartNode with ID %q over a data dir of %q succeeded", o.ID, id)
	} else if !strings.Contains(err.Error(), id) || !strings.Contains(err.Error(), "someone-else") {
		t.Fatalf("mismatched ID: %v; want an error naming both IDs", err)
	}

	back := g.start(t, func(o *NodeOptions) { o.DataDir = dir })
	if back.ID() != id {
		t.Fatalf("restarted with ID %q, want %q from %s", back.ID(), id, filepath.Join(dir, "node-id"))
	}
	if got := back.raft.LastIndex(); got < kept {
		t.Fatalf("restarted with log up to %d, want at least %d", got, kept)
	}
	t.Logf("restarted %s: %s -> %s, log at %d", id, oldAddr, back.Addr(), back.raft.LastIndex())
	joinedWithin(t, back, 30*time.Second)

	live := g.members()
	waitState(t, 30*time.Second, "the restarted member is a voter at its new address, the group 3 voters", func() (bool, string) {
		return settledOn(g, live)
	})

	// Its copy of the log has what was written before and after.
	after := testkit.CampaignWithin(t, bo, "after-restart", "other", 20*time.Second)
	waitState(t, 10*time.Second, "the restarted member's log has the leases", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		v1, err1 := back.read(ctx, "job", "", true)
		v2, err2 := back.read(ctx, "after-restart", "", true)
		return err1 == nil && err2 == nil && v1.Token == held.Token() && v2.Token == after.Token(),
			fmt.Sprintf("job %+v (%v), after-restart %+v (%v)", v1, err1, v2, err2)
	})
}

// TestRestartWithDataDirWinsElection restarts the raft leader, which keeps
// its log in a data dir, on a new port, so quickly that it wins the next
// election: the surviving voters' configuration still has it at its old
// address. Once it leads, the group must still come to list it where it
// now listens, or the next leader could not reach it.
func TestRestartWithDataDirWinsElection(t *testing.T) {
	dir := t.TempDir()
	gates := make([]*gate, 3)
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		gates[i] = &gate{}
		o.gate = gates[i]
		if i == 0 {
			o.DataDir = dir
		}
	})
	nodes := g.members()
	m, a, b := nodes[0], nodes[1], nodes[2]
	if l := readyLeaderOf(t, g); l != m {
		if err := l.raft.LeadershipTransferToServer(hraft.ServerID(m.ID()), hraft.ServerAddress(m.Addr())).Error(); err != nil {
			t.Fatalf("transfer to %s: %v", m.ID(), err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the data-dir member leads", m.isReady)
	oldAddr := m.Addr()

	// With b cut off, a cannot win an election (m's old address is dead,
	// b unreachable), so the group's next leader is the restarted m, with
	// a's vote: deterministically the case a quick restart runs into.
	gates[2].set(true)
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	g.forget(m)
	back := g.start(t, func(o *NodeOptions) { o.DataDir = dir })
	if back.ID() != m.ID() {
		t.Fatalf("restarted with ID %q, want %q", back.ID(), m.ID())
	}
	testkit.Eventually(t, 15*time.Second, "the restarted member leads again", back.isReady)
	gates[2].set(false)
	t.Logf("%s restarted %s -> %s and leads; a %s, b %s", back.ID(), oldAddr, back.Addr(), a.raft.State(), b.raft.State())

	live := g.members()
	waitState(t, 10*time.Second, "the group lists the restarted leader at its new address, 3 voters", func() (bool, string) {
		return settledOn(g, live)
	})
}

// moveLeadershipOff makes sure n is not the raft leader: it hands
// leadership to another voter and waits for that one to be ready.
func moveLeadershipOff(t testing.TB, g *testGroup, n *Node) {
	t.Helper()
	if readyLeaderOf(t, g) == n {
		if err := n.raft.LeadershipTransfer().Error(); err != nil {
			t.Fatalf("transfer leadership off %s: %v", n.ID(), err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "another member leads", func() bool {
		l := g.leader()
		return l != nil && l != n
	})
}

// newBareGroup returns a testGroup with a CA and a secret and no members.
func newBareGroup(t testing.TB) *testGroup {
	t.Helper()
	ca, err := certs.NewCA("baton test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testGroup{t: t, ca: ca, secret: "0123456789abcdef-test-secret"}
}

// newMembershipGroup is newTestGroup with per-member options: opt gets
// each member's index in start order.
func newMembershipGroup(t testing.TB, voters int, opt func(i int, o *NodeOptions)) *testGroup {
	t.Helper()
	g := newBareGroup(t)
	for i := range voters {
		g.start(t, func(o *NodeOptions) {
			o.BootstrapExpect, o.Voters = voters, voters
			opt(i, o)
		})
	}
	g.waitJoined(t)
	return g
}

// startOutsider starts a member that is not in g's discovery list.
func startOutsider(t testing.TB, o NodeOptions) *Node {
	t.Helper()
	n, err := StartNode(o)
	if err != nil {
		t.Fatalf("StartNode: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

func joinedWithin(t testing.TB, n *Node, d time.Duration) {
	t.Helper()
	select {
	case <-n.Joined():
	case <-time.After(d):
		t.Fatalf("member %s did not join within %s: %+v", n.ID(), d, n.Status())
	}
}

// readyLeaderOf waits for a ready raft leader among g's members.
func readyLeaderOf(t testing.TB, g *testGroup) *Node {
	t.Helper()
	var l *Node
	testkit.Eventually(t, 15*time.Second, "a ready raft leader", func() bool {
		l = g.leader()
		return l != nil
	})
	return l
}

// settledOn reports whether g's ready raft leader has exactly want in its
// configuration, each at its address and a voter.
func settledOn(g *testGroup, want []*Node) (bool, string) {
	l := g.leader()
	if l == nil {
		return false, "no ready raft leader"
	}
	srvs := serversOf(l)
	desc := fmt.Sprintf("leader %s: %+v", l.ID(), srvs)
	if len(srvs) != len(want) {
		return false, desc
	}
	for _, s := range srvs {
		if s.Suffrage != hraft.Voter || !slices.ContainsFunc(want, func(n *Node) bool {
			return string(s.ID) == n.ID() && string(s.Address) == n.Addr()
		}) {
			return false, desc
		}
	}
	return true, desc
}

func serversOf(n *Node) []hraft.Server {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	return f.Configuration().Servers
}

func raftTermOf(t testing.TB, n *Node) uint64 {
	t.Helper()
	term, err := strconv.ParseUint(n.raft.Stats()["term"], 10, 64)
	if err != nil {
		t.Fatalf("raft term of %s: %v", n.ID(), err)
	}
	return term
}

func assertHolder(t testing.TB, b *Backend, name, holder string, token uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := b.Leader(ctx, name)
	if err != nil {
		t.Fatalf("Leader(%q): %v", name, err)
	}
	if rec.Holder != holder || rec.Token != token {
		t.Fatalf("Leader(%q) = %+v, want holder %s token %d", name, rec, holder, token)
	}
}

// waitState is testkit.Eventually with the last state in the failure
// message.
func waitState(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testkit.EventuallyErr(t, d, what, func() error {
		if ok, desc := cond(); !ok {
			return fmt.Errorf("last state:\n%s", desc)
		}
		return nil
	})
}

// neverWithin polls cond for d and fails as soon as it holds.
func neverWithin(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if bad, desc := cond(); bad {
			t.Fatalf("%s: %s", what, desc)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logRecorder is a slog.Handler that keeps the messages of Info records
// and above, so a test can tell which path a member took.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) saw(msg string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.msgs, msg)
}

func (r *logRecorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// TestRemovalWaitsForLaggingVoter: a voter that lags behind the group's
// configuration (cut off while a replacement was promoted) must hold the
// configuration that makes the replacement a voter before the leaving
// voter is removed. hashicorp/raft refuses a vote from a server missing
// from the voter's latest configuration: were the raft leader to crash
// right after the removal, the lagging voter and the replacement would be
// the quorum left, and would elect nobody.
func TestRemovalWaitsForLaggingVoter(t *testing.T) {
	gates := make([]*gate, 3)
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		gates[i] = &gate{}
		o.gate = gates[i]
	})
	leader := readyLeaderOf(t, g)
	var lagging, leaving *Node
	var lagGate *gate
	for i, n := range g.members() {
		switch {
		case n == leader:
		case lagging == nil:
			lagging, lagGate = n, gates[i]
		default:
			leaving = n
		}
	}
	replacement := g.start(t, func(o *NodeOptions) { o.Voters = 3 })
	<-replacement.Joined()
	waitState(t, 10*time.Second, "the new member is a caught-up non-voter", func() (bool, string) {
		f := leader.raft.GetConfiguration()
		if f.Error() != nil {
			return false, f.Error().Error()
		}
		for _, s := range f.Configuration().Servers {
			if string(s.ID) == replacement.ID() {
				return s.Suffrage == hraft.Nonvoter && replacement.raft.LastIndex() >= leader.raft.LastIndex(), fmt.Sprint(s.Suffrage)
			}
		}
		return false, "not in the configuration"
	})

	lagGate.set(true)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = leaving.Close(ctx) // leaves: promotes the replacement, then is removed
	}()
	// The removal has to wait for the lagging voter, which comes back
	// after a moment.
	time.AfterFunc(500*time.Millisecond, func() { lagGate.set(false) })

	inConfig := func(n *Node, id string) (hraft.ServerSuffrage, bool) {
		f := n.raft.GetConfiguration()
		if f.Error() != nil {
			return 0, false
		}
		for _, s := range f.Configuration().Servers {
			if string(s.ID) == id {
				return s.Suffrage, true
			}
		}
		return 0, false
	}
	// Poll the leader's configuration until the leaving voter is gone; at
	// that moment the lagging voter must already list the replacement as a
	// voter.
	if !testkit.Poll(20*time.Second, time.Millisecond, func() bool { _, in := inConfig(leader, leaving.ID()); return !in }) {
		t.Fatalf("%s was not removed within 20s", leaving.ID())
	}
	if suffrage, in := inConfig(lagging, replacement.ID()); !in || suffrage != hraft.Voter {
		t.Fatalf("%s was removed while %s did not yet hold the configuration with %s as a voter (it has it: %v, as %v)",
			leaving.ID(), lagging.ID(), replacement.ID(), in, suffrage)
	}
	<-closed
	g.forget(leaving)
}
