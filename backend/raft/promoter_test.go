package raft

import (
	"slices"
	"testing"
	"time"

	hraft "github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
)

// promoterState builds an autopilot state: each server is "ID@HOST:PORT"
// with its raft state; all are healthy and stable unless listed in sick.
func promoterState(leader string, servers map[string]autopilot.RaftState, sick ...string) *autopilot.State {
	s := &autopilot.State{Servers: map[hraft.ServerID]*autopilot.ServerState{}, Leader: hraft.ServerID(leader)}
	for key, st := range servers {
		id, addr, _ := cut(key)
		s.Servers[hraft.ServerID(id)] = &autopilot.ServerState{
			Server: autopilot.Server{ID: hraft.ServerID(id), Address: hraft.ServerAddress(addr)},
			State:  st,
			Health: autopilot.ServerHealth{Healthy: !slices.Contains(sick, id), StableSince: time.Now().Add(-time.Hour)},
		}
	}
	return s
}

func cut(key string) (id, addr string, ok bool) {
	for i := range key {
		if key[i] == '@' {
			return key[:i], key[i+1:], true
		}
	}
	return key, "", false
}

func TestHostPromoterOneVoterPerHost(t *testing.T) {
	v, n, l := autopilot.RaftVoter, autopilot.RaftNonVoter, autopilot.RaftLeader
	conf := &autopilot.Config{ServerStabilizationTime: time.Second}
	for _, tc := range []struct {
		name            string
		leader          string
		servers         map[string]autopilot.RaftState
		sick            []string
		promote, demote []string
	}{
		{name: "an agent beside a voting run stays a non-voter", leader: "a",
			servers: map[string]autopilot.RaftState{"a@10.0.0.1:7390": l, "b@10.0.0.2:7390": v, "c@10.0.0.3:7390": v, "a2@10.0.0.1:7391": n}},
		{name: "a new host replaces a second voter on one host (promotion first)", leader: "b",
			servers: map[string]autopilot.RaftState{"a@10.0.0.1:7390": v, "a2@10.0.0.1:7391": v, "b@10.0.0.2:7390": l, "c@10.0.0.3:7390": n},
			promote: []string{"c"}},
		{name: "then the second voter of the host is demoted, not the raft leader", leader: "a2",
			servers: map[string]autopilot.RaftState{"a@10.0.0.1:7390": v, "a2@10.0.0.1:7391": l, "b@10.0.0.2:7390": v, "c@10.0.0.3:7390": v},
			demote:  []string{"a"}},
		{name: "fewer hosts than voters: two voters on one host", leader: "a",
			servers: map[string]autopilot.RaftState{"a@10.0.0.1:7390": l, "b@10.0.0.2:7390": v, "a2@10.0.0.1:7391": n},
			promote: []string{"a2"}},
		{name: "one machine, as in a demo: three voters on it", leader: "m1",
			servers: map[string]autopilot.RaftState{"m1@127.0.0.1:1": l, "m2@127.0.0.1:2": n, "m3@127.0.0.1:3": n, "m4@127.0.0.1:4": n},
			promote: []string{"m2", "m3"}},
		{name: "one machine at the cap: nothing demoted", leader: "m1",
			servers: map[string]autopilot.RaftState{"m1@127.0.0.1:1": l, "m2@127.0.0.1:2": v, "m3@127.0.0.1:3": v, "m4@127.0.0.1:4": v}},
		{name: "hosts with no healthy voter first, lowest ID first", leader: "b",
			servers: map[string]autopilot.RaftState{"a@10.0.0.1:7390": v, "b@10.0.0.2:7390": l, "a2@10.0.0.1:7391": n, "d@10.0.0.4:7390": n, "a0@10.0.0.1:7392": n},
			sick:    []string{"a"}, promote: []string{"a0", "d"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := (&cappedPromoter{voters: 3}).CalculatePromotionsAndDemotions(conf, promoterState(tc.leader, tc.servers, tc.sick...))
			ids := func(in []hraft.ServerID) []string {
				out := []string{}
				for _, id := range in {
					out = append(out, string(id))
				}
				slices.Sort(out)
				return out
			}
			if got, want := ids(ch.Promotions), append([]string{}, tc.promote...); !slices.Equal(got, want) {
				t.Errorf("promotions %v, want %v", got, want)
			}
			if got, want := ids(ch.Demotions), append([]string{}, tc.demote...); !slices.Equal(got, want) {
				t.Errorf("demotions %v, want %v", got, want)
			}
		})
	}
}

func TestBootstrapVotersSpreadOverHosts(t *testing.T) {
	cands := []nodeInfo{{ID: "a", Addr: "10.0.0.1:1"}, {ID: "b", Addr: "10.0.0.1:2"}, {ID: "c", Addr: "10.0.0.2:1"}, {ID: "d", Addr: "10.0.0.3:1"}}
	if got := bootstrapVoters(cands, 3); !slices.Equal(got, []bool{true, false, true, true}) {
		t.Errorf("voters of two members on one host and two others: %v, want a, c, d", got)
	}
	if got := bootstrapVoters(cands[:3], 3); !slices.Equal(got, []bool{true, true, true}) {
		t.Errorf("voters of three members on two hosts: %v, want all three", got)
	}
}
