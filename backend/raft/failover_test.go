package raft

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	hraft "github.com/hashicorp/raft"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// TestRaftLeaderHolderFailover: the holder of a lease is on the raft
// leader's member, which crashes (or is cut off) right after a confirmed
// renewal. The next raft leader times the holder's session from what the
// voters heard from the old leader (heard.go), not from its own start. The
// lease must go to a waiter, and never before the old term's safe-until as
// the old holder saw it: the grant is observed on the surviving members
// when they apply it, which is after the new leader's timer ran out.
func TestRaftLeaderHolderFailover(t *testing.T) {
	for _, crash := range []bool{true, false} {
		name := "partition"
		if crash {
			name = "crash"
		}
		t.Run(name, func(t *testing.T) {
			gates := make([]*gate, 3)
			g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
				gates[i] = &gate{}
				o.gate = gates[i]
			})
			leader := readyLeaderOf(t, g)
			var cut *gate
			var others []*Node
			for i, n := range g.members() {
				if n == leader {
					cut = gates[i]
				} else {
					others = append(others, n)
				}
			}
			cfg := backend.Config{TTL: 2 * time.Second}
			// Every member holds a lease, the others before the holder's,
			// so that the holder's member keeps raft leadership
			// (avoidLeadingAndHolding).
			var granted sync.Once
			grantedAt := make(chan time.Time, 1)
			won := make(chan baton.Term, 2)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() { cancel(); wg.Wait() })
			var standbys []*Backend
			for i, n := range others {
				b := newBackend(t, n, cfg)
				testkit.CampaignWithin(t, b, fmt.Sprintf("ballast-%d", i), fmt.Sprintf("ballast-%d", i), 20*time.Second)
				standbys = append(standbys, b)
			}
			holder := newBackend(t, leader, cfg)
			th := testkit.CampaignWithin(t, holder, "job", "holder", 20*time.Second)
			for i, n := range others {
				b := standbys[i]
				stop := n.WatchLeases(func(ev LeaseEvent) {
					if ev.Lease == "job" && ev.Kind == EventElected && ev.Holder != "holder" {
						granted.Do(func() { grantedAt <- time.Now() })
					}
				})
				t.Cleanup(stop)
				wg.Go(func() {
					if tm, err := b.Campaign(ctx, "job", baton.Candidate{ID: fmt.Sprintf("standby-%d", i)}); err == nil {
						won <- tm
					}
				})
			}
			waitWaiters(t, leader, "job", 2)

			first := th.SafeUntil()
			testkit.Eventually(t, 10*time.Second, "the holder renews with both standbys queued", func() bool { return th.SafeUntil().After(first) })
			if !leader.isReady() {
				t.Fatalf("raft leadership moved off the holder's member before the fault")
			}
			if crash {
				if err := leader.kill(); err != nil {
					t.Fatal(err)
				}
				g.forget(leader)
			} else {
				cut.set(true)
			}
			var at time.Time
			select {
			case at = <-grantedAt:
			case <-time.After(30 * time.Second):
				t.Fatal("no standby got the lease within 30 s of the raft leader's fault")
			}
			// Nothing renews the old term any more: its safe-until is
			// final.
			safeUntil := th.SafeUntil()
			if at.Before(safeUntil) {
				t.Fatalf("a standby got the lease %s before the old holder's safe-until", safeUntil.Sub(at))
			}
			var tb baton.Term
			select {
			case tb = <-won:
			case <-time.After(30 * time.Second):
				t.Fatal("the standby granted the lease did not learn of it")
			}
			if tb.Token() <= th.Token() {
				t.Fatalf("new token %d, not above the old one %d", tb.Token(), th.Token())
			}
			t.Logf("granted %s after the old holder's safe-until", at.Sub(safeUntil).Round(time.Millisecond))
			if !crash {
				cut.set(false)
			}
		})
	}
}

// TestStallWatch: a raft leader whose ticker has not run for longer than
// the gap, or ran that late a moment ago, confirms no renewal; one whose
// ticker keeps time does.
func TestStallWatch(t *testing.T) {
	now := time.Now()
	steady := func() *stallWatch {
		s := &stallWatch{gap: 100 * time.Millisecond, after: 100 * time.Millisecond}
		for d := 500 * time.Millisecond; d > 0; d -= 10 * time.Millisecond {
			s.tick(now.Add(-d))
		}
		return s
	}
	s := steady()
	s.tick(now)
	if s.recent() {
		t.Fatal("a ticker that kept time reports a stall")
	}
	s = steady()
	s.last = now.Add(-time.Second)
	if !s.recent() {
		t.Fatal("a ticker a second late is not a stall")
	}
	s = steady()
	s.tick(now.Add(-200 * time.Millisecond))
	s.tick(time.Now()) // 200 ms after the last tick: a stall that just ended
	if !s.recent() {
		t.Fatal("a stall that just ended is not reported")
	}
}

// TestLateAppendReplyCountsForNothing: a raft leader counts no reply to an
// AppendEntries (a heartbeat here) that came back later than half a
// heartbeat timeout after it sent it, since a new raft leader's margin
// covers only that much (heard.go). The voter is hashicorp/raft's own TCP
// transport on loopback, answering after a delay; a prompt answer counts.
func TestLateAppendReplyCountsForNothing(t *testing.T) {
	voter, err := hraft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { voter.Close() })
	var delay atomic.Int64
	voter.SetHeartbeatHandler(func(rpc hraft.RPC) {
		time.Sleep(time.Duration(delay.Load())) // the voter or the network is slow
		rpc.Respond(&hraft.AppendEntriesResponse{Term: 1, Success: true}, nil)
	})
	leader, err := hraft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leader.Close() })
	heartbeat := func(within time.Duration) error {
		ht := &heardTransport{NetworkTransport: leader, heard: newHeardLog(), within: within}
		req := &hraft.AppendEntriesRequest{RPCHeader: hraft.RPCHeader{ID: []byte("leader"), Addr: []byte(leader.LocalAddr())}, Term: 1}
		var resp hraft.AppendEntriesResponse
		return ht.AppendEntries("voter", voter.LocalAddr(), req, &resp)
	}

	if err := heartbeat(5 * time.Second); err != nil {
		t.Fatalf("a prompt reply was refused: %v", err)
	}
	delay.Store(int64(300 * time.Millisecond))
	err = heartbeat(100 * time.Millisecond)
	if err == nil {
		t.Fatal("a reply 300 ms after the heartbeat counted, with half a heartbeat timeout of 100 ms")
	}
	t.Logf("refused: %v", err)
}
