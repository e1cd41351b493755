package raft

import (
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// The conformance groups run at raft's default timings, as shipped: the
// suite's TTL is DefaultTTL and the members keep DefaultHeartbeatTimeout
// (the other tests' groups use 200 ms, for speed). At 200 ms, with every
// member in this one race-detector process on a loaded two-core machine,
// the raft leader counted most AppendEntries replies as late (over
// 100 ms), stepped down and was replaced hundreds of times during the
// thousand-lease campaign, and the session expired with every lease. The
// same campaign also needs the member's group-API connections reused
// (newAPIClient): a TLS handshake per call starved the process as badly.
const conformanceMinTTL = DefaultTTL

// defaultTimings gives a test group's members raft's default timings.
func defaultTimings(o *NodeOptions) {
	o.HeartbeatTimeout, o.DeadServerAfter, o.StabilizationTime = 0, 0, 0
}

// Each simulated process is a member of its own, joining a group of 3 or
// 5 voters as a non-voter: as `baton run --backend raft://` does.
func TestConformanceMembers(t *testing.T) {
	for _, voters := range []int{3, 5} {
		t.Run(map[int]string{3: "ThreeVoters", 5: "FiveVoters"}[voters], func(t *testing.T) {
			g := newTestGroup(t, voters, defaultTimings)
			batontest.Run(t, batontest.Target{MinTTL: conformanceMinTTL, OneCampaignPerName: true, New: func(t *testing.T, cfg backend.Config) *batontest.Process {
				gt := &gate{}
				n := g.start(t, func(o *NodeOptions) { o.gate = gt; o.Voters = voters })
				select {
				case <-n.Joined():
				case <-time.After(60 * time.Second):
					// Generous: the 21st member of a group joins through
					// a loaded machine's race-detector build of every
					// member; this bounds a hang, not the join's speed.
					t.Fatalf("member did not join: %+v", n.Status())
				}
				b := newBackend(t, n, cfg)
				var once sync.Once
				killed := make(chan struct{})
				return &batontest.Process{
					Backend: b,
					Kill: func() {
						once.Do(func() {
							close(killed)
							_ = n.Kill()
						})
					},
					Cut: func() { gt.set(true) },
					Heal: func() {
						select {
						case <-killed:
						default:
							gt.set(false)
						}
					},
				}
			}})
		})
	}
}

// Each simulated process is a client of an agent (a member's
// ClientHandler), reached through a proxy that cuts it off.
func TestConformanceAgentClients(t *testing.T) {
	g := newTestGroup(t, 3, defaultTimings)
	var agents []string
	for _, n := range g.members() {
		agents = append(agents, serveClients(t, n))
	}
	next := 0
	batontest.Run(t, batontest.Target{MinTTL: conformanceMinTTL, OneCampaignPerName: true, New: func(t *testing.T, cfg backend.Config) *batontest.Process {
		proxy := testserver.StartProxy(t, agents[next%len(agents)])
		next++
		c, err := Dial(proxy.Addr(), ClientOptions{Token: testClientToken, PlainTCP: true})
		if err != nil {
			t.Fatal(err)
		}
		b := newBackend(t, c, cfg)
		var once sync.Once
		killed := make(chan struct{})
		return &batontest.Process{
			Backend: b,
			Kill:    func() { once.Do(func() { close(killed); proxy.Cut() }) },
			Cut:     proxy.Cut,
			Heal: func() {
				select {
				case <-killed:
				default:
					proxy.Heal()
				}
			},
		}
	}})
}

// testClientToken is the agent token of the client APIs serveClients
// serves.
const testClientToken = "client-api-test-token"

// serveClients serves n's client API on loopback, as `baton agent` does,
// with testClientToken, and returns its address.
func serveClients(t testing.TB, n *Node) string {
	t.Helper()
	h, err := n.ClientHandler(testClientToken)
	if err != nil {
		t.Fatal(err)
	}
	return testkit.ServeHTTP(t, h)
}
