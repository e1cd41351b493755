package zookeeper_test

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// ourGoroutines counts the goroutines running a function of this package
// (not of its tests, nor of go-zookeeper).
func ourGoroutines(t *testing.T) int {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		t.Fatal(err)
	}
	// Each goroutine's stack, in the debug=2 form, is a paragraph.
	n := 0
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "baton/backend/zookeeper.") {
			n++
		}
	}
	return n
}

// A Backend holding many leases keeps no goroutine per held lease: the
// connection's event callback hands it the watch events of every held
// node, from Dial, and from New given the Watches wired into the
// connection.
func TestHeldLeasesNeedNoGoroutineEach(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	const n = 200
	for _, mode := range []string{"Dial", "New"} {
		t.Run(mode, func(t *testing.T) {
			root := uniqueRoot(t)
			before := ourGoroutines(t)
			var b *zookeeper.Backend
			if mode == "Dial" {
				b = dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
			} else {
				conn, probe := connect(t, srv.Addr(), backend.Config{})
				b = newBackend(t, conn, zookeeper.Options{Root: root, Probe: probe})
			}
			terms := make([]baton.Term, n)
			for i := range n {
				terms[i] = testkit.CampaignWithin(t, b, fmt.Sprintf("many-%d", i), "a", 10*time.Second)
			}
			// The watches are set in the background, a goroutine each
			// while its request is out: wait for them to be set.
			mine := 0
			if !testkit.Poll(10*time.Second, 20*time.Millisecond, func() bool {
				mine = ourGoroutines(t) - before
				return mine <= 4
			}) {
				t.Errorf("%d goroutines of the Backend while it holds %d leases; want a few, not one per lease", mine, n)
			}
			for _, term := range terms {
				if term.Err() != nil {
					t.Errorf("term of %s ended: %v", term.(interface{ Lease() string }).Lease(), term.Err())
				}
			}
			for _, term := range terms {
				if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestHeldNodeLossEndsTerm: a held node deleted by an operator, or
// replaced by a node of another czxid at its path while the holder was cut
// off (which it learns from the watch that its client set again on
// reconnection), ends the term with ErrLeaseLost, whether the events come
// through Watches or a goroutine per held lease waits for them.
func TestHeldNodeLossEndsTerm(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	cfg := backend.Config{TTL: 10 * time.Second}
	for _, mode := range []string{"Watches", "goroutine"} {
		for _, how := range []string{"deleted", "replaced"} {
			t.Run(mode+"/"+how, func(t *testing.T) {
				root := uniqueRoot(t)
				proxy := testserver.StartProxy(t, srv.Addr())
				conn, probe := connect(t, proxy.Addr(), cfg)
				opts := zookeeper.Options{Config: cfg, Root: root, Probe: probe}
				var b *zookeeper.Backend
				if mode == "Watches" {
					b = newBackend(t, conn, opts)
				} else {
					b = newBackendAsIs(t, conn, opts)
				}
				term := testkit.CampaignWithin(t, b, "lost", "a", 10*time.Second)
				kids := children(t, raw, root+"/lost")
				if len(kids) != 1 {
					t.Fatalf("latch children %q, want one", kids)
				}
				node := root + "/lost/" + kids[0]
				if how == "replaced" {
					proxy.Cut()
				}
				if err := raw.Delete(node, -1); err != nil {
					t.Fatal(err)
				}
				if how == "replaced" {
					if _, err := raw.Create(node, []byte("operator"), 0, zk.WorldACL(zk.PermAll)); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = raw.Delete(node, -1) })
					proxy.Heal()
				}
				testkit.WaitDone(t, term, 8*time.Second)
				if !errors.Is(term.Err(), baton.ErrLeaseLost) || !strings.Contains(term.Err().Error(), how) {
					t.Errorf("after the node was %s, Err() = %v, want ErrLeaseLost saying so", how, term.Err())
				}
				// The name is free again.
				again := testkit.CampaignWithin(t, b, "other", "a", 10*time.Second)
				_ = again.Resign(testkit.Context(t, 5*time.Second))
			})
		}
	}
}

// TestUnwiredWatchesAreRefused: a Watches that the connection never calls
// would let the Backend miss a held node's deletion; campaigns must fail
// rather than hold leases blind. And one Watches serves one Backend.
func TestUnwiredWatchesAreRefused(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	conn, probe := connect(t, srv.Addr(), backend.Config{})
	b := newBackend(t, conn, zookeeper.Options{Root: uniqueRoot(t), Probe: probe, Watches: zookeeper.NewWatches()})
	_, err := b.Campaign(testkit.Context(t, 10*time.Second), "unwired", baton.Candidate{ID: "x"})
	if !errors.Is(err, baton.ErrBackendUnavailable) || !strings.Contains(err.Error(), "Watches") {
		t.Errorf("Campaign with Watches the connection does not call: err = %v, want ErrBackendUnavailable naming Watches", err)
	}
	w, _ := watchesOf.Load(conn)
	newBackend(t, conn, zookeeper.Options{Root: uniqueRoot(t), Probe: probe})
	_, err = zookeeper.New(conn, zookeeper.Options{Root: uniqueRoot(t), Probe: probe, Watches: w.(*zookeeper.Watches)})
	if cerr := (*baton.ConfigError)(nil); !errors.As(err, &cerr) {
		t.Errorf("New with Watches that serve another Backend: err = %v, want a *baton.ConfigError", err)
	}
}
