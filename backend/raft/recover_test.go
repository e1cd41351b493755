package raft

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
	hraft "github.com/hashicorp/raft"
)

// platform is an in-memory model of the machines members run on: each
// address runs until the test terminates it. It is a Terminations that
// answers from its state at each call, as EC2 does.
type platform struct {
	mu         sync.Mutex
	terminated map[string]bool
	asked      int
}

func newPlatform() *platform { return &platform{terminated: map[string]bool{}} }

func (p *platform) Place(context.Context, []string) error { return nil }

func (p *platform) Terminated(_ context.Context, addrs []string) (map[string]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked++
	out := map[string]string{}
	for _, a := range addrs {
		if p.terminated[a] {
			out[a] = "terminated (test platform)"
		}
	}
	return out, nil
}

func (p *platform) terminate(addrs ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range addrs {
		p.terminated[a] = true
	}
}

func (p *platform) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked
}

// lineRecorder keeps the records logged at Warn and above, and passes every
// record on to next (nil: none).
type lineRecorder struct {
	mu   sync.Mutex
	recs []string
	next slog.Handler
}

type lineHandler struct {
	r     *lineRecorder
	attrs []slog.Attr
	next  slog.Handler
}

func (h *lineHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *lineHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s", rec.Level, rec.Message)
		for _, a := range h.attrs {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		}
		rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
		h.r.mu.Lock()
		h.r.recs = append(h.r.recs, b.String())
		h.r.mu.Unlock()
	}
	if h.next != nil {
		return h.next.Handle(ctx, rec)
	}
	return nil
}
func (h *lineHandler) WithAttrs(as []slog.Attr) slog.Handler {
	next := h.next
	if next != nil {
		next = next.WithAttrs(as)
	}
	return &lineHandler{r: h.r, attrs: append(slices.Clone(h.attrs), as...), next: next}
}
func (h *lineHandler) WithGroup(name string) slog.Handler {
	next := h.next
	if next != nil {
		next = next.WithGroup(name)
	}
	return &lineHandler{r: h.r, attrs: h.attrs, next: next}
}

func (r *lineRecorder) logger(t testing.TB) *slog.Logger {
	h := &lineHandler{r: r}
	if l := testLogger(t); l != nil {
		h.next = l.Handler()
	}
	return slog.New(h)
}

// find returns the first record that contains every one of subs.
func (r *lineRecorder) find(subs ...string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		ok := true
		for _, s := range subs {
			if !strings.Contains(rec, s) {
				ok = false
				break
			}
		}
		if ok {
			return rec, true
		}
	}
	return "", false
}

// recoverOpts are the group's options in the recovery tests: a short
// RecoverAfter (DeadServerAfter), assessments every 300 ms, and a MaxTTL
// of a second, so that the hold is short.
func recoverOpts(p *platform, logs *lineRecorder, t testing.TB) func(int, *NodeOptions) {
	return func(_ int, o *NodeOptions) {
		if p != nil {
			o.Terminations = p
		}
		o.DeparturesEvery = 300 * time.Millisecond
		o.MaxTTL = time.Second
		if logs != nil {
			o.Logger = logs.logger(t)
		}
	}
}

// readyAlone waits until n is the ready raft leader of a configuration of
// itself alone.
func readyAlone(t testing.TB, n *Node, within time.Duration) {
	t.Helper()
	testkit.Eventually(t, within, n.ID()+" to lead a recovered group", func() bool {
		return n.isReady() && len(serversOf(n)) >= 1 && slices.ContainsFunc(serversOf(n), func(s hraft.Server) bool { return string(s.ID) == n.ID() })
	})
}

// TestRecoverFromLostMajority: two of three voters are killed and the
// platform proves their machines terminated. The survivor recovers on its
// own: it leads, the lease its Backend held is granted again only after
// the hold, with a token above every token of the old group (the lost
// majority granted a lease, at an index the survivor never saw, while the
// survivor was cut off), and two replacements join the recovered group and
// become voters.
func TestRecoverFromLostMajority(t *testing.T) {
	plat := newPlatform()
	logs := &lineRecorder{}
	gates := make([]*gate, 3)
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		gates[i] = &gate{}
		o.gate = gates[i]
		recoverOpts(plat, logs, t)(i, o)
	})
	ms := g.members()
	survivor, lost := ms[0], ms[1:]
	cfg := backend.Config{TTL: time.Second}
	sb := newBackend(t, survivor, cfg)
	held := testkit.CampaignWithin(t, sb, "job", "survivor", 20*time.Second)
	oldToken := held.Token()

	// The survivor is cut off; the majority goes on and grants a lease the
	// survivor never hears of.
	gates[0].set(true)
	lb := newBackend(t, lost[0], cfg)
	// Many grants, so that the majority's log runs well ahead of the
	// survivor's: only a new epoch puts the survivor's next tokens above
	// them.
	var other baton.Term
	for i := range 20 {
		other = testkit.CampaignWithin(t, lb, "other", fmt.Sprintf("majority-%d", i), 20*time.Second)
		if i < 19 {
			if err := other.Resign(testkit.Context(t, 10*time.Second)); err != nil {
				t.Fatalf("resign: %v", err)
			}
		}
	}
	if other.Token() <= oldToken {
		t.Fatalf("the majority's token %d is not above the survivor's %d", other.Token(), oldToken)
	}
	for _, n := range lost {
		if err := n.kill(); err != nil {
			t.Fatal(err)
		}
		g.forget(n)
		plat.terminate(n.Addr())
	}
	gates[0].set(false)
	testkit.WaitDone(t, held, 10*time.Second)

	readyAlone(t, survivor, 60*time.Second)
	survivor.recMu.Lock()
	decided, hold := survivor.rec.decided, survivor.rec.hold
	survivor.recMu.Unlock()
	if decided.IsZero() {
		t.Fatal("the survivor leads, but no recovery was decided")
	}
	if _, ok := logs.find("recovering the group from the loss of its quorum", "proof"); !ok {
		t.Errorf("no log line says the group recovers on the proof")
	}

	for _, lease := range []string{"other", "job"} {
		tm := testkit.CampaignWithin(t, sb, lease, "survivor-again", 30*time.Second)
		if at := time.Now(); at.Before(decided.Add(hold)) {
			t.Errorf("%s granted %s after the recovery decision, before the hold (%s) passed", lease, at.Sub(decided), hold)
		}
		if tm.Token() <= other.Token() {
			t.Errorf("%s granted with token %d (epoch %d), not above the lost majority's %d (epoch %d)", lease, tm.Token(), tm.Token()>>32, other.Token(), other.Token()>>32)
		}
	}

	// Replacements arrive and join the recovered group.
	var repl []*Node
	for range 2 {
		repl = append(repl, g.start(t, func(o *NodeOptions) {
			o.BootstrapExpect, o.Voters = 3, 3
			recoverOpts(plat, logs, t)(0, o)
		}))
	}
	g.waitJoined(t)
	want := append([]*Node{survivor}, repl...)
	testkit.Eventually(t, 30*time.Second, "the survivor and the replacements to be the voters", func() bool {
		ok, _ := settledOn(g, want)
		return ok
	})
}

// TestLostMajorityWithoutProof: two of three voters are killed, and
// nothing proves their machines gone (the platform says they still run,
// or there is no platform at all, as with static or DNS discovery). The
// survivor never recovers on its own; it says at Error what happened, since
// when, why it will not recover, and the command that does. The operator's
// word through that command (RequestRecovery) recovers it, after refusing
// a request that does not name every lost voter.
func TestLostMajorityWithoutProof(t *testing.T) {
	for _, withPlatform := range []bool{true, false} {
		t.Run(fmt.Sprintf("platform=%v", withPlatform), func(t *testing.T) {
			var plat *platform
			if withPlatform {
				plat = newPlatform()
			}
			logs := &lineRecorder{}
			g := newMembershipGroup(t, 3, recoverOpts(plat, logs, t))
			ms := g.members()
			survivor, lost := ms[0], ms[1:]
			var lostAddrs []string
			for _, n := range lost {
				lostAddrs = append(lostAddrs, n.Addr())
				if err := n.kill(); err != nil {
					t.Fatal(err)
				}
				g.forget(n)
			}
			slices.Sort(lostAddrs)
			command := RecoverCommand(survivor.Addr(), lostAddrs)
			var line string
			testkit.Eventually(t, 30*time.Second, "an Error naming the lost voters and the command", func() bool {
				var ok bool
				line, ok = logs.find("ERROR", "lost its quorum", "will not recover it by itself", command, lost[0].ID(), lost[1].ID(), "unreachable since")
				return ok
			})
			t.Logf("survivor said: %s", line)
			if withPlatform && plat.calls() == 0 {
				t.Errorf("the survivor never asked the platform")
			}
			if survivor.raft.State() == hraft.Leader {
				t.Fatalf("the survivor leads without proof or the operator's word")
			}

			ctx := testkit.Context(t, 30*time.Second)
			_, err := RequestRecovery(ctx, survivor.opts.TLS, []string{g.secret}, survivor.Addr(), lostAddrs[:1])
			var ae *RecoveryRefusedError
			if !errors.As(err, &ae) || !strings.Contains(ae.Reason, "do not answer either") || !strings.Contains(ae.Reason, lostAddrs[1]) {
				t.Fatalf("a recovery naming one of two lost voters: err %v, want a refusal naming the other", err)
			}
			res, err := RequestRecovery(ctx, survivor.opts.TLS, []string{g.secret}, survivor.Addr(), lostAddrs)
			if err != nil {
				t.Fatalf("RequestRecovery: %v", err)
			}
			if res.ID != survivor.ID() {
				t.Errorf("recovered %s, want %s", res.ID, survivor.ID())
			}
			readyAlone(t, survivor, 30*time.Second)
			b := newBackend(t, survivor, backend.Config{TTL: time.Second})
			testkit.CampaignWithin(t, b, "job", "after", 30*time.Second)
		})
	}
}

// TestMinorityPartitionNeverRecovers: one voter of three is cut off from
// the others, for many times RecoverAfter, with discovery listing every
// member or only itself. The platform (like an Auto Scaling group that
// reports them InService) proves nothing terminated. The cut-off member
// must never lead, the majority keeps one leader, and once the cut heals
// the group is one group again.
func TestMinorityPartitionNeverRecovers(t *testing.T) {
	for _, seesOnlyItself := range []bool{false, true} {
		t.Run(fmt.Sprintf("discovery-sees-only-itself=%v", seesOnlyItself), func(t *testing.T) {
			plat := newPlatform()
			logs := &lineRecorder{}
			gates := make([]*gate, 3)
			discs := make([]*switchPeers, 3)
			g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
				gates[i] = &gate{}
				o.gate = gates[i]
				discs[i] = &switchPeers{inner: o.Discovery}
				o.Discovery = discs[i]
				recoverOpts(plat, logs, t)(i, o)
			})
			leader := readyLeaderOf(t, g)
			ms := g.members()
			cut := slices.IndexFunc(ms, func(n *Node) bool { return n != leader })
			minority := ms[cut]
			if seesOnlyItself {
				discs[cut].only([]string{minority.Addr()})
			}
			gates[cut].set(true)
			// It takes the Error to know that the member looked and
			// found no proof.
			var majority []string
			for _, n := range ms {
				if n != minority {
					majority = append(majority, n.ID())
				}
			}
			testkit.Eventually(t, 30*time.Second, "the cut-off member to report the lost quorum", func() bool {
				_, ok := logs.find("ERROR", "lost its quorum", "not proven terminated", majority[0], majority[1])
				return ok
			})
			deadline := time.Now().Add(3 * minority.opts.RecoverAfter)
			for time.Now().Before(deadline) {
				if minority.raft.State() == hraft.Leader {
					t.Fatalf("the cut-off member leads: a second group")
				}
				if l := g.leader(); l == nil || l == minority {
					// An election among the majority may be under way;
					// never the minority.
					if l == minority {
						t.Fatalf("the cut-off member is a ready leader")
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if _, ok := logs.find("recovering the group"); ok {
				t.Fatalf("a member recovered: %v", logs.recs)
			}
			gates[cut].set(false)
			testkit.Eventually(t, 30*time.Second, "one group again", func() bool {
				l := g.leader()
				if l == nil {
					return false
				}
				for _, n := range g.members() {
					if _, id := n.raft.LeaderWithID(); string(id) != l.ID() {
						return false
					}
				}
				return true
			})
		})
	}
}

// switchPeers is a Discoverer that answers as inner until the test gives
// it a list of its own.
type switchPeers struct {
	inner Discoverer
	mu    sync.Mutex
	list  []string
}

func (p *switchPeers) only(list []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = list
}

func (p *switchPeers) Peers(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	list := p.list
	p.mu.Unlock()
	if list != nil {
		return slices.Clone(list), nil
	}
	return p.inner.Peers(ctx)
}

// TestMemberReturnsAfterRecovery: a voter is killed and another cut off;
// the operator recovers the survivor, naming both. When the cut-off member
// comes back, with its log and its old configuration, it must not form or
// disrupt a second group: the survivor stays the only leader, its lease
// term survives, and the returning member joins the recovered group.
func TestMemberReturnsAfterRecovery(t *testing.T) {
	logs := &lineRecorder{}
	gates := make([]*gate, 3)
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		gates[i] = &gate{}
		o.gate = gates[i]
		recoverOpts(nil, logs, t)(i, o)
	})
	ms := g.members()
	survivor, dead, away := ms[0], ms[1], ms[2]
	gates[2].set(true)
	if err := dead.kill(); err != nil {
		t.Fatal(err)
	}
	g.forget(dead)
	ctx := testkit.Context(t, 60*time.Second)
	testkit.EventuallyErr(t, 30*time.Second, "the operator's recovery", func() error {
		_, err := RequestRecovery(ctx, survivor.opts.TLS, []string{g.secret}, survivor.Addr(), []string{dead.Addr(), away.Addr()})
		return err
	})
	readyAlone(t, survivor, 30*time.Second)
	b := newBackend(t, survivor, backend.Config{TTL: time.Second})
	term := testkit.CampaignWithin(t, b, "job", "survivor", 30*time.Second)
	termBefore := raftTermOf(t, survivor)

	gates[2].set(false)
	testkit.Eventually(t, 30*time.Second, "the returning member in the recovered group", func() bool {
		return slices.ContainsFunc(serversOf(survivor), func(s hraft.Server) bool { return string(s.ID) == away.ID() }) &&
			away.Status().Leader == survivor.ID()
	})
	if away.raft.State() == hraft.Leader {
		t.Fatalf("the returning member leads")
	}
	select {
	case <-term.Done():
		t.Fatalf("the survivor's term ended when the member came back: %v", term.Err())
	default:
	}
	if got := raftTermOf(t, survivor); got != termBefore {
		t.Logf("the survivor's raft term went from %d to %d when the member came back", termBefore, got)
	}
	if !survivor.isReady() {
		t.Fatalf("the survivor no longer leads")
	}
}

// TestNoVotesFromAReusedAddress: two voters of three die, and fresh
// members (no log, new IDs) start at their addresses, as replacement
// instances that got the dead ones' IPs would. They must not stand in for
// the dead voters: were their votes counted, the survivor would lead the
// old configuration with a log that may lack what the dead majority
// committed, and grant tokens below theirs. The survivor stays without a
// leader (and says so) until the group is recovered; then the fresh
// members join it.
func TestNoVotesFromAReusedAddress(t *testing.T) {
	logs := &lineRecorder{}
	g := newMembershipGroup(t, 3, recoverOpts(nil, logs, t))
	// The survivor is a follower: a raft leader that still leads when the
	// others die keeps its quorum through fresh members that answer its
	// appends at their addresses (its log is complete, so tokens still
	// rise; docs/guarantees.md), and a vote is what this test is about.
	leader := readyLeaderOf(t, g)
	var survivor *Node
	var dead []*Node
	for _, n := range g.members() {
		if survivor == nil && n != leader {
			survivor = n
		} else {
			dead = append(dead, n)
		}
	}
	var addrs []string
	for _, n := range dead {
		addrs = append(addrs, n.Addr())
		if err := n.kill(); err != nil {
			t.Fatal(err)
		}
		g.forget(n)
	}
	var fresh []*Node
	for _, a := range addrs {
		fresh = append(fresh, g.start(t, func(o *NodeOptions) {
			o.BindAddr, o.BootstrapExpect, o.Voters = a, 3, 3
			recoverOpts(nil, logs, t)(0, o)
		}))
	}
	testkit.Eventually(t, 30*time.Second, "the survivor to report the lost quorum", func() bool {
		_, ok := logs.find("ERROR", "lost its quorum", dead[0].ID(), dead[1].ID())
		return ok
	})
	if survivor.raft.State() == hraft.Leader {
		t.Fatalf("the survivor leads the old configuration on the votes of fresh members at the dead voters' addresses")
	}
	ctx := testkit.Context(t, 30*time.Second)
	testkit.EventuallyErr(t, 20*time.Second, "the operator's recovery", func() error {
		_, err := RequestRecovery(ctx, survivor.opts.TLS, []string{g.secret}, survivor.Addr(), addrs)
		return err
	})
	g.waitJoined(t)
	testkit.Eventually(t, 30*time.Second, "the survivor and the fresh members to be the voters", func() bool {
		ok, _ := settledOn(g, append([]*Node{survivor}, fresh...))
		return ok
	})
}

// TestTwoSurvivorsOneRecovers: three of five voters die; two survive.
// Only the survivor with the most advanced log (equal logs: the lower ID)
// may recover: the other refuses the operator's word and names it. Once it
// has recovered, the other joins its group.
func TestTwoSurvivorsOneRecovers(t *testing.T) {
	logs := &lineRecorder{}
	g := newMembershipGroup(t, 5, recoverOpts(nil, logs, t))
	ms := g.members()
	slices.SortFunc(ms, func(a, b *Node) int { return strings.Compare(a.ID(), b.ID()) })
	survivors := ms[:2]
	var lostAddrs []string
	for _, n := range ms[2:] {
		lostAddrs = append(lostAddrs, n.Addr())
		if err := n.kill(); err != nil {
			t.Fatal(err)
		}
		g.forget(n)
	}
	// The logs settle: both survivors hold the same last entry, so the
	// lower ID is the one.
	testkit.Eventually(t, 20*time.Second, "the survivors' logs to agree", func() bool {
		i0, t0 := survivors[0].lastLog()
		i1, t1 := survivors[1].lastLog()
		return i0 == i1 && t0 == t1 && survivors[0].raft.State() != hraft.Leader && survivors[1].raft.State() != hraft.Leader
	})
	ctx := testkit.Context(t, 60*time.Second)
	var refused *RecoveryRefusedError
	testkit.Eventually(t, 20*time.Second, "the other survivor to refuse, naming the one to recover", func() bool {
		_, err := RequestRecovery(ctx, survivors[1].opts.TLS, []string{g.secret}, survivors[1].Addr(), lostAddrs)
		return errors.As(err, &refused) && strings.Contains(refused.Reason, survivors[0].ID()) && strings.Contains(refused.Reason, "most advanced log")
	})
	testkit.EventuallyErr(t, 20*time.Second, "the recovery of the one", func() error {
		_, err := RequestRecovery(ctx, survivors[0].opts.TLS, []string{g.secret}, survivors[0].Addr(), lostAddrs)
		return err
	})
	readyAlone(t, survivors[0], 30*time.Second)
	testkit.Eventually(t, 30*time.Second, "both survivors to be the voters", func() bool {
		ok, _ := settledOn(g, survivors)
		return ok
	})
}
