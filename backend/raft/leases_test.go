package raft

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
	hraft "github.com/hashicorp/raft"
)

// eventLog collects a member's lease events (WatchLeases).
type eventLog struct {
	mu  sync.Mutex
	evs []LeaseEvent
}

func watchEvents(t testing.TB, n *Node) *eventLog {
	t.Helper()
	l := &eventLog{}
	stop := n.WatchLeases(func(ev LeaseEvent) {
		l.mu.Lock()
		l.evs = append(l.evs, ev)
		l.mu.Unlock()
	})
	t.Cleanup(stop)
	return l
}

// of returns the events of lease, as "kind holder reason" lines.
func (l *eventLog) of(lease string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ev := range l.evs {
		if ev.Lease == lease {
			out = append(out, strings.TrimSpace(fmt.Sprintf("%s %s %s", ev.Kind, ev.Holder, ev.Reason)))
		}
	}
	return out
}

func (l *eventLog) find(lease string, kind EventKind, holder string) (LeaseEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.evs {
		if ev.Lease == lease && ev.Kind == kind && ev.Holder == holder {
			return ev, true
		}
	}
	return LeaseEvent{}, false
}

// waitEvents waits until lease's events are want.
func (l *eventLog) waitEvents(t testing.TB, lease string, want ...string) {
	t.Helper()
	waitState(t, 20*time.Second, fmt.Sprintf("events of %q are %q", lease, want), func() (bool, string) {
		got := l.of(lease)
		return slices.Equal(got, want), strings.Join(got, "\n")
	})
}

func waitWaiters(t testing.TB, n *Node, name string, want int) {
	t.Helper()
	waitState(t, 10*time.Second, fmt.Sprintf("%d waiters for %q", want, name), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		li, err := n.Lease(ctx, name)
		return err == nil && li.Waiters == want, fmt.Sprintf("%+v %v", li, err)
	})
}

func TestLeasesTable(t *testing.T) {
	g := newTestGroup(t, 3)
	leader := readyLeaderOf(t, g)
	var follower *Node
	for _, n := range g.members() {
		if n != leader {
			follower = n
		}
	}
	const ttl = 5 * time.Second
	cfg := backend.Config{TTL: ttl}
	ba := newBackend(t, follower, cfg)
	ta := testkit.CampaignWithin(t, ba, "job", "a", 20*time.Second)
	tz := testkit.CampaignWithin(t, ba, "alpha", "a", 20*time.Second)
	// A holder through an agent: its session is made through the agent's
	// member.
	c, err := Dial(serveClients(t, leader), ClientOptions{Token: testClientToken, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	bc := newBackend(t, c, cfg)
	got := testkit.CampaignAsync(t, bc, "job", "c")
	waitWaiters(t, follower, "job", 1)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := time.Now()
	infos, err := follower.Leases(ctx) // forwarded to the raft leader
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "alpha" || infos[1].Name != "job" {
		t.Fatalf("Leases = %+v, want alpha and job, sorted", infos)
	}
	job := infos[1]
	if job.Holder != "a" || job.Token != ta.Token() || job.Member != follower.ID() || job.Waiters != 1 || job.ResignRequested {
		t.Fatalf("job = %+v, want holder a, token %d, member %s, 1 waiter", job, ta.Token(), follower.ID())
	}
	if job.Since.IsZero() || job.SafeUntil.Before(ta.SafeUntil()) || job.SafeUntil.After(before.Add(ttl+time.Second)) {
		t.Fatalf("job since %v safe-until %v; want a time, and safe-until between the holder's %v and a TTL from now",
			job.Since, job.SafeUntil, ta.SafeUntil())
	}
	if infos[0].Token != tz.Token() || infos[0].Waiters != 0 {
		t.Fatalf("alpha = %+v, want token %d and no waiters", infos[0], tz.Token())
	}

	if err := ta.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	tc := testkit.WaitTerm(t, got, 25*time.Second).Term
	li, err := leader.Lease(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if li.Holder != "c" || li.Token != tc.Token() || li.Member != leader.ID() || li.Waiters != 0 {
		t.Fatalf("job after hand-over = %+v, want agent client c (member %s), token %d", li, leader.ID(), tc.Token())
	}
	if _, err := follower.Lease(ctx, "nobody-here"); !errors.Is(err, baton.ErrNoLeader) {
		t.Fatalf("Lease of an unknown name: %v, want ErrNoLeader", err)
	}
}

func TestWatchLeasesEvents(t *testing.T) {
	g := newTestGroup(t, 3)
	nodes := g.members()
	evs := watchEvents(t, nodes[0])
	cfg := backend.Config{TTL: 5 * time.Second}
	ba, bb, bc := newBackend(t, nodes[1], cfg), newBackend(t, nodes[2], cfg), newBackend(t, nodes[0], cfg)

	ta := testkit.CampaignWithin(t, ba, "job", "a", 20*time.Second)
	gotB := testkit.CampaignAsync(t, bb, "job", "b")
	waitWaiters(t, nodes[0], "job", 1)
	// c gives up waiting.
	ctx, cancel := context.WithCancel(context.Background())
	cdone := make(chan error, 1)
	go func() {
		_, err := bc.Campaign(ctx, "job", baton.Candidate{ID: "c"})
		cdone <- err
	}()
	waitWaiters(t, nodes[0], "job", 2)
	cancel()
	if err := <-cdone; !errors.Is(err, context.Canceled) {
		t.Fatalf("c's cancelled campaign: %v", err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if err := ta.Resign(rctx); err != nil {
		t.Fatal(err)
	}
	tb := testkit.WaitTerm(t, gotB, 25*time.Second).Term
	if err := bb.Close(rctx); err != nil {
		t.Fatal(err)
	}
	evs.waitEvents(t, "job",
		"elected a", "queued b", "queued c", "dequeued c",
		"released a resigned", "elected b", "released b session-closed")
	if ev, _ := evs.find("job", EventElected, "b"); ev.Token != tb.Token() || ev.Member != nodes[2].ID() || ev.Session == "" || ev.At.IsZero() {
		t.Fatalf("b's elected event %+v, want token %d, member %s, a session and a time", ev, tb.Token(), nodes[2].ID())
	}
	if ev, _ := evs.find("job", EventReleased, "a"); ev.Token != ta.Token() || ev.Member != nodes[1].ID() {
		t.Fatalf("a's released event %+v, want token %d, member %s", ev, ta.Token(), nodes[1].ID())
	}

	// A holder whose member dies: the raft leader expires its session a
	// TTL later. The member joins as a non-voter, so it never leads.
	m := g.start(t)
	joinedWithin(t, m, 30*time.Second)
	bm := newBackend(t, m, backend.Config{TTL: time.Second})
	tm := testkit.CampaignWithin(t, bm, "crash", "m", 20*time.Second)
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	evs.waitEvents(t, "crash", "elected m", "lost m session-expired")
	if ev, _ := evs.find("crash", EventLost, "m"); ev.Token != tm.Token() || ev.Member != m.ID() {
		t.Fatalf("lost event %+v, want token %d, member %s", ev, tm.Token(), m.ID())
	}
}

func TestWatchLeasesStop(t *testing.T) {
	g := newTestGroup(t, 1)
	n := g.members()[0]
	var calls atomic.Int32
	block := make(chan struct{})
	stop := n.WatchLeases(func(LeaseEvent) {
		calls.Add(1)
		<-block
	})
	b := newBackend(t, n, backend.Config{TTL: 5 * time.Second})
	testkit.CampaignWithin(t, b, "one", "a", 20*time.Second)
	testkit.CampaignWithin(t, b, "two", "a", 20*time.Second)
	testkit.Eventually(t, 10*time.Second, "fn called", func() bool { return calls.Load() == 1 })
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while fn was running")
	default:
	}
	close(block)
	<-stopped
	stop() // twice is fine
	after := calls.Load()
	testkit.CampaignWithin(t, b, "three", "a", 20*time.Second)
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := calls.Load(); got != after {
		t.Fatalf("fn called %d times after stop returned", got-after)
	}
}

// TestRequestResign: a requested resign reaches the holder at its next
// renewal as a request (ResignRequested), not as the end of its term: the
// lease stays the holder's, renewed, until the holder resigns, and only
// then goes to the waiter, long before the TTL (30 s here) could have. The
// events show a release, not a loss.
func TestRequestResign(t *testing.T) {
	g := newTestGroup(t, 3)
	nodes := g.members()
	agent := serveClients(t, nodes[2])
	cfg := backend.Config{TTL: 30 * time.Second, RenewInterval: 200 * time.Millisecond}
	for _, holder := range []string{"member", "agent"} {
		t.Run(holder, func(t *testing.T) {
			evs := watchEvents(t, nodes[0])
			var gr Group = nodes[1]
			if holder == "agent" {
				c, err := Dial(agent, ClientOptions{Token: testClientToken, PlainTCP: true})
				if err != nil {
					t.Fatal(err)
				}
				gr = c
			}
			ba, bb := newBackend(t, gr, cfg), newBackend(t, nodes[0], cfg)
			lease := "resign-" + holder
			ta := testkit.CampaignWithin(t, ba, lease, "a", 20*time.Second)
			gotB := testkit.CampaignAsync(t, bb, lease, "b")
			waitWaiters(t, nodes[0], lease, 1)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := nodes[2].RequestResign(ctx, lease); err != nil {
				t.Fatal(err)
			}
			li, err := nodes[2].Lease(ctx, lease)
			if err != nil {
				t.Fatal(err)
			}
			if li.Holder == "a" && !li.ResignRequested {
				t.Fatalf("after RequestResign, %+v: want ResignRequested while a holds it", li)
			}
			select {
			case <-baton.ResignRequestedOf(ta):
			case <-time.After(20 * time.Second):
				t.Fatal("the holder was not told of the request")
			}
			// The holder's work winds down: several renewals pass, and the
			// lease stays its own.
			until := ta.SafeUntil()
			waitState(t, 10*time.Second, "three more renewals of the holder", func() (bool, string) {
				return ta.SafeUntil().After(until.Add(3 * cfg.RenewInterval)), ta.SafeUntil().String()
			})
			select {
			case <-ta.Done():
				t.Fatalf("the request ended the holder's term (%v) before it resigned", ta.Err())
			case w := <-gotB:
				t.Fatalf("b was elected (token %d) before the holder resigned", w.Term.Token())
			default:
			}
			if li, err := nodes[2].Lease(ctx, lease); err != nil || li.Holder != "a" || !li.ResignRequested {
				t.Fatalf("while the holder winds down, %+v (%v): want a, resign requested", li, err)
			}
			if err := ta.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if err := ta.Err(); !errors.Is(err, baton.ErrResigned) || !strings.Contains(err.Error(), "resign requested via the group API") {
				t.Fatalf("holder's term ended with %v, want ErrResigned, requested via the group API", err)
			}
			tb := testkit.WaitTerm(t, gotB, 25*time.Second).Term
			if tb.Token() <= ta.Token() {
				t.Fatalf("b's token %d not above a's %d", tb.Token(), ta.Token())
			}
			evs.waitEvents(t, lease, "elected a", "queued b", "released a resign-requested", "elected b")
			li, err = nodes[1].Lease(ctx, lease)
			if err != nil {
				t.Fatal(err)
			}
			if li.Holder != "b" || li.ResignRequested {
				t.Fatalf("after the hand-over %+v, want holder b and no resign request (a new term clears it)", li)
			}
			if err := tb.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if err := nodes[1].RequestResign(ctx, lease); !errors.Is(err, baton.ErrNoLeader) {
				t.Fatalf("RequestResign of a free lease: %v, want ErrNoLeader", err)
			}
		})
	}
}

func TestDetermined(t *testing.T) {
	g := newTestGroup(t, 3)
	nodes := g.members()
	readyLeaderOf(t, g)
	waitState(t, 10*time.Second, "every member determined", func() (bool, string) {
		var bad []string
		for _, n := range nodes {
			if err := n.Determined(); err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", n.ID(), err))
			}
		}
		return len(bad) == 0, strings.Join(bad, "\n")
	})
	for _, n := range nodes[:2] {
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	survivor := nodes[2]
	waitState(t, 10*time.Second, "the survivor without a quorum is not determined", func() (bool, string) {
		err := survivor.Determined()
		return err != nil, fmt.Sprintf("%+v", survivor.Status())
	})
	t.Logf("survivor: %v", survivor.Determined())
	if err := nodes[0].Determined(); err == nil {
		t.Fatal("a killed member says it is determined")
	}
}

func TestOnRenew(t *testing.T) {
	var own, clients atomic.Int32
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		switch i {
		case 0:
			o.OnRenew = func(_ time.Duration, err error) {
				if err == nil {
					own.Add(1)
				}
			}
		case 1:
			o.OnRenew = func(_ time.Duration, err error) {
				if err == nil {
					clients.Add(1)
				}
			}
		}
	})
	nodes := g.members()
	cfg := backend.Config{TTL: time.Second}
	testkit.CampaignWithin(t, newBackend(t, nodes[0], cfg), "own", "a", 20*time.Second)
	c, err := Dial(serveClients(t, nodes[1]), ClientOptions{Token: testClientToken, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CampaignWithin(t, newBackend(t, c, cfg), "client", "b", 20*time.Second)
	testkit.Eventually(t, 10*time.Second, "renewals of a member's Backend and of an agent client reported", func() bool {
		return own.Load() >= 2 && clients.Load() >= 2
	})
}

// deafGroup is a Group that never reports a lease change: a Backend on it
// learns that its term is over only from the log's answers to its own
// commands, as a holder that has not noticed yet would.
type deafGroup struct{ Group }

func (deafGroup) wait(ctx context.Context, _, _ string, _, _ uint64) (leaseView, error) {
	<-ctx.Done()
	return leaseView{}, ctx.Err()
}

func sessionOf(b *Backend) string {
	return b.sessions.Live().ID
}

// applyOnLeader applies c on the ready raft leader itself, as its own
// timers do: members refuse to forward the leader's own commands, and
// commands on an agent client's session.
func applyOnLeader(ctx context.Context, g *testGroup, c command) (*result, error) {
	return retryNotLeader(ctx, func(context.Context) (*result, error) {
		for _, n := range g.members() {
			if n.isReady() {
				return n.applyLocal(c)
			}
		}
		return nil, ErrNotLeader
	})
}

// TestStateFencedByTheLog: a term that the log no longer has as the holder
// (its session expired there, or the lease went to another term) but that
// has not noticed fails StoreState with ErrLeaseLost, ends, and the state
// is unchanged.
func TestStateFencedByTheLog(t *testing.T) {
	g := newTestGroup(t, 3, func(o *NodeOptions) { o.MaxTTL = time.Minute })
	nodes := g.members()
	agent := serveClients(t, nodes[1])
	// A TTL far beyond the test, so that no renewal tells the holder.
	cfg := backend.Config{TTL: time.Minute}
	for _, via := range []string{"member", "agent"} {
		for _, how := range []string{"SessionExpired", "TakenOver"} {
			t.Run(via+"/"+how, func(t *testing.T) {
				var gr Group = nodes[2]
				if via == "agent" {
					c, err := Dial(agent, ClientOptions{Token: testClientToken, PlainTCP: true})
					if err != nil {
						t.Fatal(err)
					}
					gr = c
				}
				lease := "fenced-" + via + "-" + how
				ba := newBackend(t, deafGroup{gr}, cfg)
				ta := testkit.CampaignWithin(t, ba, lease, "a", 20*time.Second)
				sta, _ := ta.(baton.StateTerm)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := sta.StoreState(ctx, []byte("from a")); err != nil {
					t.Fatal(err)
				}
				want := "from a"
				sid := sessionOf(ba)
				switch how {
				case "SessionExpired":
					// What the raft leader's timer does.
					if _, err := applyOnLeader(ctx, g, command{Op: opSessionExpire, Session: sid, Time: time.Now()}); err != nil {
						t.Fatal(err)
					}
				case "TakenOver":
					bb := newBackend(t, nodes[0], cfg)
					gotB := testkit.CampaignAsync(t, bb, lease, "b")
					waitWaiters(t, nodes[0], lease, 1)
					// A release the holder did not make (a stale one, say):
					// its session lives on.
					if _, err := applyOnLeader(ctx, g, command{Op: opRelease, Session: sid, Lease: lease, Token: ta.Token(), Time: time.Now()}); err != nil {
						t.Fatal(err)
					}
					tb := testkit.WaitTerm(t, gotB, 25*time.Second).Term
					stb, _ := tb.(baton.StateTerm)
					if err := stb.StoreState(ctx, []byte("from b")); err != nil {
						t.Fatal(err)
					}
					want = "from b"
				}
				if err := ta.Err(); err != nil {
					t.Fatalf("the holder noticed on its own (%v); the test needs it not to", err)
				}
				err := sta.StoreState(ctx, []byte("stale"))
				if !errors.Is(err, baton.ErrLeaseLost) {
					t.Fatalf("StoreState of a term the log no longer has: %v, want ErrLeaseLost", err)
				}
				if !errors.Is(ta.Err(), baton.ErrLeaseLost) {
					t.Fatalf("the term after the refused store: %v, want ended with ErrLeaseLost", ta.Err())
				}
				v, err := sta.LoadState(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if string(v) != want {
					t.Fatalf("state after the refused store = %q, want %q", v, want)
				}
				if err := sta.StoreState(ctx, []byte("again")); !errors.Is(err, baton.ErrLeaseLost) {
					t.Fatalf("StoreState of the ended term: %v, want its end reason (ErrLeaseLost)", err)
				}
			})
		}
	}
}

// TestStateOutlivesLease: the state stays when nobody holds or waits for
// the lease, and an empty value is a stored value.
func TestStateOutlivesLease(t *testing.T) {
	g := newTestGroup(t, 1)
	n := g.members()[0]
	b := newBackend(t, n, backend.Config{TTL: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t1 := testkit.CampaignWithin(t, b, "job", "a", 20*time.Second)
	s1, _ := t1.(baton.StateTerm)
	if err := s1.StoreState(ctx, []byte{}); err != nil {
		t.Fatal(err)
	}
	if err := t1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Lease(ctx, "job"); !errors.Is(err, baton.ErrNoLeader) {
		t.Fatalf("Lease after the only holder resigned: %v, want ErrNoLeader (the record is gone)", err)
	}
	t2 := testkit.CampaignWithin(t, b, "job", "a", 20*time.Second)
	s2, _ := t2.(baton.StateTerm)
	v, err := s2.LoadState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v == nil || len(v) != 0 {
		t.Fatalf("LoadState = %#v, want the stored empty value (not nil)", v)
	}
}

// memSink is a snapshot sink in memory.
type memSink struct{ bytes.Buffer }

func (*memSink) ID() string                    { return "mem" }
func (*memSink) Cancel() error                 { return nil }
func (*memSink) Close() error                  { return nil }
func (s *memSink) Write(p []byte) (int, error) { return s.Buffer.Write(p) }

// testLog applies commands to FSMs as raft would, each as the log's next
// entry.
type testLog struct {
	t     *testing.T
	index uint64 // the index of the last entry applied
}

// apply applies c to f as the log's next entry and returns its result.
func (l *testLog) apply(f *fsm, c command) *result {
	l.t.Helper()
	l.index++
	b, err := json.Marshal(c)
	if err != nil {
		l.t.Fatal(err)
	}
	return f.Apply(&hraft.Log{Index: l.index, Type: hraft.LogCommand, Data: b}).(*result)
}

// restored returns a new FSM restored from a snapshot of f, as a member
// that installs f's snapshot would have.
func restored(t *testing.T, f *fsm) *fsm {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	g := newFSM()
	if err := g.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestSnapshotKeepsStateAndResignRequests: lease states and resign
// requests survive a snapshot and its restore.
func TestSnapshotKeepsStateAndResignRequests(t *testing.T) {
	f := newFSM()
	log := &testLog{t: t}
	apply := func(c command) *result { return log.apply(f, c) }
	apply(command{Op: opSessionCreate, Session: "s1", Node: "n1", TTL: time.Second})
	r := apply(command{Op: opAcquire, Session: "s1", Lease: "job", Candidate: "a", Time: time.Now()})
	if !r.Holder {
		t.Fatalf("acquire: %+v", r)
	}
	if r := apply(command{Op: opStateStore, Session: "s1", Lease: "job", Token: r.Token, Value: []byte("slot 7")}); r.Lost || r.Err != "" {
		t.Fatalf("state-store: %+v", r)
	}
	apply(command{Op: opRequestResign, Lease: "job"})
	apply(command{Op: opSessionCreate, Session: "s2", Node: "n2", TTL: time.Second})
	r = apply(command{Op: opAcquire, Session: "s2", Lease: "other", Candidate: "b", Time: time.Now()})
	apply(command{Op: opStateStore, Session: "s2", Lease: "other", Token: r.Token, Value: []byte("x")})
	apply(command{Op: opSessionDestroy, Session: "s2"}) // "other" is gone; its state stays

	g := restored(t, f)
	if v := g.state("job"); string(v.Value) != "slot 7" || !v.Stored {
		t.Fatalf("restored state of job = %+v", v)
	}
	if v := g.state("other"); string(v.Value) != "x" {
		t.Fatalf("restored state of a forgotten lease = %+v", v)
	}
	rows := g.table("")
	if len(rows) != 1 || !rows[0].ResignRequested || rows[0].Member != "n1" {
		t.Fatalf("restored table = %+v, want job with its resign request", rows)
	}
	if got := g.resigns("s1"); len(got) != 1 || got[0].Lease != "job" {
		t.Fatalf("restored resign orders of s1 = %+v", got)
	}
}

// TestHoldingMembersAndResignOrders: holdingMembers names the members whose
// own sessions hold a lease (not a session that only waits, not an agent
// client's), and resigns returns a session's resign orders sorted by lease,
// among the many leases it holds.
func TestHoldingMembersAndResignOrders(t *testing.T) {
	f := newFSM()
	log := &testLog{t: t}
	apply := func(c command) *result { return log.apply(f, c) }
	apply(command{Op: opSessionCreate, Session: "holds", Node: "n1", TTL: time.Second})
	apply(command{Op: opSessionCreate, Session: "waits", Node: "n2", TTL: time.Second})
	apply(command{Op: opSessionCreate, Session: "agent", Node: "n3", TTL: time.Second, Agent: true})
	for i := range 50 {
		if r := apply(command{Op: opAcquire, Session: "holds", Lease: fmt.Sprintf("l%02d", i), Candidate: "a", Time: time.Now()}); !r.Holder {
			t.Fatalf("acquire l%02d: %+v", i, r)
		}
		apply(command{Op: opAcquire, Session: "waits", Lease: fmt.Sprintf("l%02d", i), Candidate: "b", Time: time.Now()})
	}
	if r := apply(command{Op: opAcquire, Session: "agent", Lease: "agent-lease", Candidate: "c", Time: time.Now()}); !r.Holder {
		t.Fatalf("acquire agent-lease: %+v", r)
	}
	if got := f.holdingMembers(); len(got) != 1 || !got["n1"] {
		t.Fatalf("holdingMembers = %v, want n1 alone", got)
	}
	if got := f.resigns("holds"); len(got) != 0 {
		t.Fatalf("resign orders before any request = %+v", got)
	}
	for _, l := range []string{"l33", "l07", "l41"} {
		apply(command{Op: opRequestResign, Lease: l})
	}
	got := f.resigns("holds")
	if len(got) != 3 || got[0].Lease != "l07" || got[1].Lease != "l33" || got[2].Lease != "l41" {
		t.Fatalf("resign orders = %+v, want l07, l33, l41", got)
	}
	if got := f.resigns("waits"); len(got) != 0 {
		t.Fatalf("resign orders of a waiting session = %+v", got)
	}
	apply(command{Op: opSessionDestroy, Session: "holds"})
	if got := f.holdingMembers(); len(got) != 1 || !got["n2"] {
		t.Fatalf("holdingMembers after the holder's session ended = %v, want n2 (its waits were promoted)", got)
	}
}
