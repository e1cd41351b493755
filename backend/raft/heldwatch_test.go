package raft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
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
