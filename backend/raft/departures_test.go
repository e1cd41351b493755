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
	hraft "github.com/hashicorp/raft"
)

// groupWord is a Departures that reports what the test says the group
// reports: an in-memory stand-in for an Auto Scaling group's view.
type groupWord struct {
	mu       sync.Mutex
	departed map[string]string // address -> reason
	calls    int
}

func newGroupWord() *groupWord { return &groupWord{departed: map[string]string{}} }

func (g *groupWord) Departed(_ context.Context, addrs []string) (map[string]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	out := map[string]string{}
	for _, a := range addrs {
		if r, ok := g.departed[a]; ok {
			out[a] = r
		}
	}
	return out, nil
}

func (g *groupWord) depart(addr, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.departed[addr] = reason
}

// departureOptions gives a member the group's word and a dead-server
// timeout that no test here waits out: every removal seen within a test is
// the departure watch's.
func departureOptions(word *groupWord, logs *logRecorder) func(*NodeOptions) {
	return func(o *NodeOptions) {
		o.Departures = word
		o.DeadServerAfter = 10 * time.Minute
		o.DeparturesEvery = 500 * time.Millisecond
		o.Logger = slog.New(logs)
	}
}

func inConfig(n *Node, id string) bool {
	return slices.ContainsFunc(serversOf(n), func(s hraft.Server) bool { return string(s.ID) == id })
}

func (r *logRecorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := 0
	for _, m := range r.msgs {
		if m == msg {
			c++
		}
	}
	return c
}

const (
	msgRemovedDeparted = "removing a member whose instance departed and that no longer answers"
	msgKeptAnswering   = "the platform reports this member's instance departed, but the member still answers: keeping it"
)

// TestDeparturesRemoveDeadMember: a voter that died is removed as soon as
// the group reports its instance departed, long before the dead-server
// timeout, and not before.
func TestDeparturesRemoveDeadMember(t *testing.T) {
	word, logs := newGroupWord(), &logRecorder{}
	opt := departureOptions(word, logs)
	g := newMembershipGroup(t, 3, func(_ int, o *NodeOptions) { opt(o) })
	leader := readyLeaderOf(t, g)
	var victim *Node
	var live []*Node
	for _, n := range g.members() {
		if n != leader && victim == nil {
			victim = n
		} else {
			live = append(live, n)
		}
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	g.forget(victim)

	// Dead but not reported: only the dead-server timeout (10 min) would
	// remove it.
	neverWithin(t, 3*time.Second, "a dead member the group did not report was removed", func() (bool, string) {
		return !inConfig(leader, victim.ID()), fmt.Sprintf("%+v", serversOf(leader))
	})

	word.depart(victim.Addr(), "instance i-0c is Terminating:Wait")
	waitState(t, 10*time.Second, "the departed, dead voter is removed; the two live members are the voters", func() (bool, string) {
		return settledOn(g, live)
	})
	if !logs.saw(msgRemovedDeparted) {
		t.Errorf("no log of the removal; logs: %q", logs.messages())
	}
	// The two left commit.
	probeLease(t, live[0], "after-removal", backend.Config{TTL: time.Second})
}

// TestDeparturesKeepAnsweringMember: a member that the group reports
// departed but that still answers is kept, and the disagreement is logged
// once per reason by a member that leads, not at every tick. Once it stops
// answering, it goes.
func TestDeparturesKeepAnsweringMember(t *testing.T) {
	word := newGroupWord()
	recs := []*reasonRecorder{{}, {}, {}}
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		departureOptions(word, &logRecorder{})(o)
		o.Logger = slog.New(recs[i])
	})
	leader := readyLeaderOf(t, g)
	var alive *Node
	for _, n := range g.members() {
		if n != leader {
			alive = n
			break
		}
	}
	// logged reports how many members logged the disagreement for reason,
	// and the most times one member logged it.
	logged := func(reason string) (members, most int) {
		for _, r := range recs {
			if c := r.count(msgKeptAnswering, reason); c > 0 {
				members++
				most = max(most, c)
			}
		}
		return members, most
	}
	const left, proceeding = "instance i-0b has left group web", "instance i-0b is Terminating:Proceed"

	word.depart(alive.Addr(), left)
	waitState(t, 10*time.Second, "the disagreement is logged", func() (bool, string) {
		m, _ := logged(left)
		return m > 0, fmt.Sprintf("%d members logged it", m)
	})
	// Many ticks (every 200 ms) and asks later: still a member, and no
	// member logged it twice.
	neverWithin(t, 3*time.Second, "a member that answers was removed, or the disagreement logged again", func() (bool, string) {
		_, most := logged(left)
		return !inConfig(leader, alive.ID()) || most > 1, fmt.Sprintf("servers %+v; logged at most %d times by one member", serversOf(leader), most)
	})

	// A new reason is a new state: logged once more.
	word.depart(alive.Addr(), proceeding)
	waitState(t, 10*time.Second, "the new reason is logged", func() (bool, string) {
		m, _ := logged(proceeding)
		return m > 0, fmt.Sprintf("%d members logged it", m)
	})
	if _, most := logged(left); most > 1 {
		t.Fatalf("a member logged the first reason %d times", most)
	}

	// It stops answering: now it goes.
	if err := alive.Kill(); err != nil {
		t.Fatal(err)
	}
	g.forget(alive)
	waitState(t, 10*time.Second, "the member that stopped answering is removed", func() (bool, string) {
		l := g.leader()
		return l != nil && !inConfig(l, alive.ID()), fmt.Sprintf("%+v", serversOf(leader))
	})
	for _, r := range recs {
		if r.count(msgRemovedDeparted, proceeding) > 0 {
			return
		}
	}
	t.Error("no member logged the removal")
}

// reasonRecorder is a slog.Handler that keeps each record's message and
// its "reason" attribute.
type reasonRecorder struct {
	mu   sync.Mutex
	recs []string
}

func (r *reasonRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (r *reasonRecorder) Handle(_ context.Context, rec slog.Record) error {
	reason := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			reason = a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Message+"|"+reason)
	return nil
}

func (r *reasonRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *reasonRecorder) WithGroup(string) slog.Handler      { return r }

func (r *reasonRecorder) count(msg, reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := 0
	for _, m := range r.recs {
		if m == msg+"|"+reason {
			c++
		}
	}
	return c
}

// TestDeparturesReplaceAllThree replaces each member of a 3-voter group in
// turn, faster than the dead-server timeout: a new instance joins, then an
// old one dies without leaving (a crash, or a termination baton did not
// see), the raft leader's included. Without the departure watch the dead
// voters pile up in the configuration (the replacement is promoted beside
// the dead one) and the second crash costs the quorum; with it, each
// departed voter goes before the next one dies, and the group keeps a
// committing majority of live members throughout.
func TestDeparturesReplaceAllThree(t *testing.T) {
	word, logs := newGroupWord(), &logRecorder{}
	opt := departureOptions(word, logs)
	g := newMembershipGroup(t, 3, func(_ int, o *NodeOptions) { opt(o) })
	readyLeaderOf(t, g)
	live := g.members()
	var originals []string
	for _, n := range live {
		originals = append(originals, n.ID())
	}
	cfg := backend.Config{TTL: time.Second}

	for round := range 3 {
		fresh := g.start(t, opt)
		joinedWithin(t, fresh, 30*time.Second)
		old := live[0]
		if round == 1 {
			// This round's crash takes the raft leader.
			l := readyLeaderOf(t, g)
			if l != old {
				if err := l.raft.LeadershipTransferToServer(hraft.ServerID(old.ID()), hraft.ServerAddress(old.Addr())).Error(); err != nil {
					t.Fatalf("move raft leadership to %s: %v", old.ID(), err)
				}
				waitState(t, 10*time.Second, "the oldest member leads", func() (bool, string) {
					l := g.leader()
					return l == old, fmt.Sprintf("leader %s", old.Status().Leader)
				})
			}
		}
		live = append(slices.Clone(live[1:]), fresh)
		t.Logf("round %d: %s joined; killing %s (raft leader: %v)", round, fresh.ID(), old.ID(), old.isReady())
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
		g.forget(old)
		word.depart(old.Addr(), fmt.Sprintf("instance of %s has left group web", old.ID()))

		waitState(t, 20*time.Second, fmt.Sprintf("round %d: the configuration is the 3 live members, all voters", round), func() (bool, string) {
			ok, desc := settledOn(g, live)
			return ok, desc + "\nlogs: " + strings.Join(logs.messages(), "\n")
		})
		// The group commits: a campaign through the newest member.
		probeLease(t, fresh, fmt.Sprintf("round-%d", round), cfg)
	}
	for _, s := range serversOf(readyLeaderOf(t, g)) {
		if slices.Contains(originals, string(s.ID)) {
			t.Fatalf("original member %s is still in the configuration", s.ID)
		}
	}
	if n := logs.count(msgRemovedDeparted); n < 3 {
		t.Errorf("%d removals logged, want one per replaced member (3); logs: %q", n, logs.messages())
	}
}

// heldCounter is an ExpectCounter that blocks until the test releases it.
type heldCounter struct {
	release chan struct{}
	count   int
}

func (c *heldCounter) BootstrapExpect(ctx context.Context) (int, error) {
	select {
	case <-c.release:
		return c.count, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestExpectCounter: with an ExpectCounter, members do not bootstrap until
// it answers, then form one group of the count it gave.
func TestExpectCounter(t *testing.T) {
	g := newBareGroup(t)
	counter := &heldCounter{release: make(chan struct{}), count: 3}
	auto := func(o *NodeOptions) { o.ExpectCounter = counter }
	a, b, c := g.start(t, auto), g.start(t, auto), g.start(t, auto)
	neverWithin(t, 10*g.options(t).HeartbeatTimeout, "members formed a group before the counter answered", func() (bool, string) {
		for _, n := range []*Node{a, b, c} {
			if n.raft.LastIndex() > 0 {
				return true, fmt.Sprintf("%+v", n.Status())
			}
		}
		return false, ""
	})
	close(counter.release)
	g.waitJoined(t)
	want := slices.Sorted(slices.Values([]string{a.ID(), b.ID(), c.ID()}))
	waitState(t, 10*time.Second, "one group of all three", func() (bool, string) {
		st := a.Status()
		return st.Leader != "" && slices.Equal(slices.Sorted(slices.Values(st.Voters)), want), fmt.Sprintf("%+v", st)
	})
}

func TestExpectCounterOptions(t *testing.T) {
	g := newBareGroup(t)
	o := g.options(t)
	o.BootstrapExpect = 3
	o.ExpectCounter = &heldCounter{release: make(chan struct{})}
	o.DeparturesEvery = -time.Second
	_, err := StartNode(o)
	var ce *baton.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *baton.ConfigError", err)
	}
	for _, want := range []string{"ExpectCounter is set", "DeparturesEvery -1s is negative"} {
		if !slices.ContainsFunc(ce.Problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("problems %q lack %q", ce.Problems, want)
		}
	}
}

// freshWord is a groupWord that implements DeparturesSince and records the
// since of each call.
type freshWord struct {
	*groupWord
	sinces []time.Time
}

func (f *freshWord) DepartedSince(ctx context.Context, addrs []string, since time.Time) (map[string]string, error) {
	f.mu.Lock()
	f.sinces = append(f.sinces, since)
	f.mu.Unlock()
	return f.Departed(ctx, addrs)
}

// latestSince returns the last non-zero since asked for.
func (f *freshWord) latestSince() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range slices.Backward(f.sinces) {
		if !s.IsZero() {
			return s
		}
	}
	return time.Time{}
}

// TestDeparturesSinceAsksForQuietMember: once a voter goes quiet, the
// leader asks a DeparturesSince for a view newer than the voter's last
// answer (a time before it died, and not long before), so that a cache
// filled before its instance went away cannot keep it until autopilot's
// dead-server timeout.
func TestDeparturesSinceAsksForQuietMember(t *testing.T) {
	word, logs := &freshWord{groupWord: newGroupWord()}, &logRecorder{}
	opt := departureOptions(word.groupWord, logs)
	g := newMembershipGroup(t, 3, func(_ int, o *NodeOptions) { opt(o); o.Departures = word })
	leader := readyLeaderOf(t, g)
	var victim *Node
	var live []*Node
	for _, n := range g.members() {
		if n != leader && victim == nil {
			victim = n
		} else {
			live = append(live, n)
		}
	}
	if !word.latestSince().IsZero() {
		t.Fatalf("asked for a view since %v while every member answers", word.latestSince())
	}
	killedAt := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	g.forget(victim)
	waitState(t, 10*time.Second, "the leader asks for a view newer than the quiet voter's last answer", func() (bool, string) {
		s := word.latestSince()
		return !s.IsZero(), fmt.Sprintf("since %v", s)
	})
	// The view asked for must be no older than the victim's last answer,
	// just before it was killed. It may be newer: on a loaded machine a live
	// member can look quiet for a moment, and the leader asks for a view
	// newer than every quiet member's last answer, which covers the victim's.
	if s := word.latestSince(); s.Before(killedAt.Add(-3 * time.Second)) {
		t.Errorf("asked for a view since %v; want one no older than the victim's last answer, just before it was killed at %v", s, killedAt)
	}
	word.depart(victim.Addr(), "instance i-0c is no longer in Auto Scaling group web")
	waitState(t, 10*time.Second, "the departed, dead voter is removed", func() (bool, string) {
		return settledOn(g, live)
	})
}
