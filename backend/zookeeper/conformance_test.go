package zookeeper_test

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testserver"
)

// TestMain stops the ZooKeeper server the package's tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopSharedZooKeeper()
	os.Exit(code)
}

func TestConformance(t *testing.T) { batontest.Run(t, target(t)) }

// TestLeaderWatch: a standby hears who leads from the Backend's watch
// (baton.LeaderWatcher), without asking.
func TestLeaderWatch(t *testing.T) { batontest.LeaderWatch(t, target(t)) }

// target is the conformance suite's Target: processes on one server.
func target(t *testing.T) batontest.Target {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	counter, _ := connect(t, srv.Addr(), backend.Config{})
	return batontest.Target{
		OneCampaignPerName: true,
		// The latch nodes, as Curator's LeaderLatch lays them out.
		Candidates: func(t *testing.T, lease string) int {
			n := 0
			for _, c := range children(t, counter, root+"/"+lease) {
				if strings.Contains(c, "latch-") {
					n++
				}
			}
			return n
		},
		// The server's minSessionTimeout; it raises shorter ones.
		MinTTL: testserver.ZooKeeperMinSessionTimeout,
		New: func(t *testing.T, cfg backend.Config) *batontest.Process {
			// Each process reaches ZooKeeper through a proxy of its own,
			// so that cutting one off leaves the others connected. The
			// connection is the test's (New, not Dial), as a process
			// sharing its client with other code would have it.
			proxy := testserver.StartProxy(t, srv.Addr())
			conn, probe := connect(t, proxy.Addr(), cfg)
			b := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
			var once sync.Once
			killed := make(chan struct{})
			return &batontest.Process{
				Backend: b,
				// A process killed with -9 never deletes its nodes nor
				// closes its session: cut it off first, so that not even
				// the client's close request gets through, then stop the
				// client, and never heal.
				Kill: func() {
					once.Do(func() {
						close(killed)
						proxy.Cut()
						kill(conn)
					})
				},
				Cut: proxy.Cut,
				Heal: func() {
					select {
					case <-killed:
					default:
						proxy.Heal()
					}
				},
			}
		},
	}
}
