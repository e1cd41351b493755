package raft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
	hraft "github.com/hashicorp/raft"
)

// A Backend on a member holding many leases keeps no goroutine per held
// lease: one subscription to the member's lease events watches them all.
func TestHeldLeasesNeedNoGoroutineEach(t *testing.T) {
	const n = 300
	g := newTestGroup(t, 1)
	b := newBackend(t, g.members()[0], backend.Config{TTL: 5 * time.Second})
	// The first term starts the session and the watch.
	first := testkit.CampaignWithin(t, b, "many-first", "a", 20*time.Second)
	before := runtime.NumGoroutine()
	terms := []baton.Term{first}
	for i := range n {
		terms = append(terms, testkit.CampaignWithin(t, b, fmt.Sprintf("many-%d", i), "a", 20*time.Second))
	}
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		t.Fatal(err)
	}
	// Each goroutine's stack, in the debug=2 form, is a paragraph.
	mine := 0
	for _, st := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(st, "raft.(*Backend)") || strings.Contains(st, "raft.(*heldWatch)") {
			mine++
		}
	}
	if mine > 4 {
		t.Errorf("%d goroutines of the Backend while it holds %d leases; want a few, not one per lease", mine, n+1)
	}
	if grown := runtime.NumGoroutine() - before; grown > n/10 {
		t.Errorf("the process has %d more goroutines after %d more leases were won; want a few, not one per lease", grown, n)
	}
	for _, term := range terms {
		if err := term.Err(); err != nil {
			t.Fatalf("lease %s ended while held: %v", term.Lease(), err)
		}
		if err := term.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// A held term ends, with ErrLeaseLost, as soon as the holder's copy of the
// log gives its lease to another term: the raft leader expired its session,
// a release the holder did not make landed (the lease went to a waiter), or
// the holder's member caught up from a snapshot that holds such a change
// (a snapshot's entries give no lease events). The TTL is far beyond the
// test, so that no renewal tells the holder first.
func TestHeldTermEndsWhenTheLogGivesItAway(t *testing.T) {
	gates := []*gate{{}, {}, {}}
	started := 0
	g := newTestGroup(t, 3, func(o *NodeOptions) {
		o.MaxTTL = 10 * time.Minute
		if started < len(gates) {
			o.gate = gates[started]
			started++
		}
	})
	nodes := g.members()
	agent := serveClients(t, nodes[1])
	cfg := backend.Config{TTL: 5 * time.Minute}
	for _, tc := range []struct{ via, how string }{
		{"member", "SessionExpired"}, {"member", "TakenOver"}, {"member", "FromASnapshot"},
		{"agent", "SessionExpired"}, {"agent", "TakenOver"},
	} {
		t.Run(tc.via+"/"+tc.how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// The holder's member: a follower, so that it can be cut off
			// from the raft leader while the group goes on.
			var hn *Node
			var hgate *gate
			testkit.Eventually(t, 20*time.Second, "a follower", func() bool {
				for i, n := range nodes {
					if !n.isReady() && n.raft.State() == hraft.Follower {
						hn, hgate = n, gates[i]
						return true
					}
				}
				return false
			})
			var gr Group = hn
			if tc.via == "agent" {
				c, err := Dial(agent, ClientOptions{Token: testClientToken, PlainTCP: true})
				if err != nil {
					t.Fatal(err)
				}
				gr = c
			}
			lease := "given-away-" + tc.via + "-" + tc.how
			ba := newBackend(t, gr, cfg)
			ta := testkit.CampaignWithin(t, ba, lease, "a", 20*time.Second)
			sid := sessionOf(ba)
			switch tc.how {
			case "SessionExpired":
				// What the raft leader's timer does.
				if _, err := applyOnLeader(ctx, g, command{Op: opSessionExpire, Session: sid, Time: time.Now()}); err != nil {
					t.Fatal(err)
				}
			case "TakenOver":
				// A release the holder did not make (a stale one, say):
				// its session lives on, and the lease goes to b.
				other := nodes[0]
				if other == hn {
					other = nodes[2]
				}
				bb := newBackend(t, other, cfg)
				gotB := testkit.CampaignAsync(t, bb, lease, "b")
				waitWaiters(t, other, lease, 1)
				if _, err := applyOnLeader(ctx, g, command{Op: opRelease, Session: sid, Lease: lease, Token: ta.Token(), Time: time.Now()}); err != nil {
					t.Fatal(err)
				}
				tb := testkit.WaitTerm(t, gotB, 25*time.Second).Term
				defer func() { _ = tb.Resign(context.Background()) }()
			case "FromASnapshot":
				// The holder's member is cut off while the raft leader
				// expires the session, snapshots and drops its log: it
				// learns of the expiry only from the snapshot it is sent.
				hgate.set(true)
				defer hgate.set(false)
				if _, err := applyOnLeader(ctx, g, command{Op: opSessionExpire, Session: sid, Time: time.Now()}); err != nil {
					t.Fatal(err)
				}
				l := g.leader()
				if l == nil {
					t.Fatal("no raft leader")
				}
				r := l.raft.get()
				rc := r.ReloadableConfig()
				rc.TrailingLogs = 0
				if err := r.ReloadConfig(rc); err != nil {
					t.Fatal(err)
				}
				if err := r.Snapshot().Error(); err != nil {
					t.Fatalf("snapshot on the raft leader: %v", err)
				}
				if err := ta.Err(); err != nil {
					t.Fatalf("the cut-off holder's term ended before its member heard of the expiry: %v", err)
				}
				hgate.set(false)
			}
			select {
			case <-ta.Done():
			case <-ctx.Done():
				t.Fatalf("the term goes on %s after its holder's member could learn that the log gave its lease away", time.Minute)
			}
			if err := ta.Err(); !errors.Is(err, baton.ErrLeaseLost) {
				t.Fatalf("the term ended with %v, want ErrLeaseLost", err)
			}
		})
	}
}

// pollGauge counts the long-polls in flight through an agent's handler:
// POST /v1/raft/held and the per-lease GET /v1/raft/lease?wait=.
type pollGauge struct {
	mu                               sync.Mutex
	held, lease, peakHeld, peakLease int
}

func (g *pollGauge) wrap(h http.Handler, refuseHeld bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n, peak *int
		switch {
		case r.URL.Path == "/v1/raft/held" && refuseHeld:
			// An agent of an earlier version.
			http.Error(w, "404 page not found", http.StatusNotFound)
			return
		case r.URL.Path == "/v1/raft/held":
			n, peak = &g.held, &g.peakHeld
		case r.URL.Path == "/v1/raft/lease" && r.URL.Query().Get("wait") != "":
			n, peak = &g.lease, &g.peakLease
		}
		if n != nil {
			g.mu.Lock()
			*n++
			*peak = max(*peak, *n)
			g.mu.Unlock()
			defer func() {
				g.mu.Lock()
				*n--
				g.mu.Unlock()
			}()
		}
		h.ServeHTTP(w, r)
	})
}

func (g *pollGauge) now() (held, lease int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held, g.lease
}

// An agent client holding many leases watches them all with one
// long-poll of the agent, not one per lease (each a goroutine and a
// connection), and still ends a term at once when the log gives its lease
// away; an agent of an earlier version, without the call, is long-polled
// per lease.
func TestAgentClientWatchesHeldLeasesInOnePoll(t *testing.T) {
	const n = 100
	g := newTestGroup(t, 1, func(o *NodeOptions) { o.MaxTTL = 10 * time.Minute })
	h, err := g.members()[0].ClientHandler(testClientToken)
	if err != nil {
		t.Fatal(err)
	}
	cfg := backend.Config{TTL: 5 * time.Minute}
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "agent", true: "earlier agent"}[old], func(t *testing.T) {
			var gauge pollGauge
			c, err := Dial(testkit.ServeHTTP(t, gauge.wrap(h, old)), ClientOptions{Token: testClientToken, PlainTCP: true})
			if err != nil {
				t.Fatal(err)
			}
			b := newBackend(t, c, cfg)
			terms := make([]baton.Term, n)
			for i := range terms {
				terms[i] = testkit.CampaignWithin(t, b, fmt.Sprintf("poll-%v-%d", old, i), "a", 20*time.Second)
			}
			wantHeld, wantLease := 1, 0
			if old {
				wantHeld, wantLease = 0, n
			}
			testkit.Eventually(t, 20*time.Second, "the held leases' long-polls", func() bool {
				held, lease := gauge.now()
				return held == wantHeld && lease == wantLease
			})
			if !old && gauge.peakLease > 0 {
				t.Errorf("%d per-lease long-polls at once; want none", gauge.peakLease)
			}
			if !old && gauge.peakHeld > 2 {
				t.Errorf("%d held polls at once; want one (two while one is restarted)", gauge.peakHeld)
			}
			// A release the holder did not make: the lease goes to nobody.
			lost := terms[n/2]
			ctx := testkit.Context(t, 20*time.Second)
			if _, err := applyOnLeader(ctx, g, command{Op: opRelease, Session: sessionOf(b), Lease: lost.Lease(), Token: lost.Token(), Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
			testkit.WaitDone(t, lost, 10*time.Second)
			if !errors.Is(lost.Err(), baton.ErrLeaseLost) {
				t.Fatalf("the given-away term ended with %v, want ErrLeaseLost", lost.Err())
			}
			for _, term := range terms {
				if term != lost && term.Err() != nil {
					t.Fatalf("lease %s ended with %v; only the given-away one may", term.Lease(), term.Err())
				}
			}
			for _, term := range terms {
				if term != lost {
					if err := term.Resign(t.Context()); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
	// A call naming more terms than a member takes is refused, naming the
	// limit.
	c, err := Dial(testkit.ServeHTTP(t, h), ClientOptions{Token: testClientToken, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	terms := map[string]uint64{}
	for i := range maxHeldTerms + 1 {
		terms[fmt.Sprint(i)] = 1
	}
	_, err = c.heldLost(testkit.Context(t, 10*time.Second), "s", terms, 0, time.Second)
	if ae := (*apiError)(nil); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Msg, fmt.Sprint(maxHeldTerms)) {
		t.Errorf("a held call naming %d terms: %v, want 400 naming the limit", len(terms), err)
	}
}
