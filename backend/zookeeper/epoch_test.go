package zookeeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/epoch"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// TestTokensRiseAcrossWipedZooKeeper is the attack of a ZooKeeper that
// loses its data: stopped, and a server with an empty data directory
// started in its place (behind the same address), so its zxids start again
// from the bottom. A process campaigning there afterwards must get a token
// above the last one given before. It is a new process: ZooKeeper refuses
// a client that has seen a higher zxid than its own ("client must try
// another server"), so the old process's connection never gets back in.
func TestTokensRiseAcrossWipedZooKeeper(t *testing.T) {
	srv := testserver.StartZooKeeper(t, testserver.ZooKeeperOptions{})
	proxy := testserver.StartProxy(t, srv.Addr())
	cfg := baton.Config{TTL: 2 * time.Second}
	b := dial(t, proxy.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg}})
	last := termsOn(t, b, 5, 0)
	lastAt := time.Now()
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	// The documented assumption: the new epoch is created in a later
	// second than the old one, by the wall clock.
	eventually(t, 2*time.Second, "the wall clock to pass the last term's second", func() bool {
		return epoch.Of(time.Now()) > epoch.Of(lastAt)
	})
	srv = testserver.StartZooKeeper(t, testserver.ZooKeeperOptions{})
	proxy.Retarget(srv.Addr())
	b2 := dial(t, proxy.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg}})
	first := termsOn(t, b2, 1, last)
	t.Logf("token %#x before the wipe, %#x after", last, first)
}

// termsOn takes lease "job" n times on b, resigning each term, checks that
// every token is above after (and the one before it), and returns the last
// one. Failed campaigns are retried, as the Elector does: after ZooKeeper
// lost its data, the first ones may fail.
func termsOn(t *testing.T, b *zookeeper.Backend, n int, after uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < n; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		term, err := b.Campaign(ctx, "job", baton.Candidate{ID: "c"})
		cancel()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("campaign: %v", err)
			}
			time.Sleep(50 * time.Millisecond) // the Elector's back-off
			continue
		}
		if term.Token() <= after {
			t.Fatalf("token %#x is not above %#x", term.Token(), after)
		}
		rec, err := b.Leader(context.Background(), "job")
		if err != nil || rec.Token != term.Token() {
			t.Fatalf("Leader = %+v, %v; want token %#x", rec, err, term.Token())
		}
		after = term.Token()
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		if err := term.Resign(ctx); err != nil {
			t.Fatalf("resign: %v", err)
		}
		cancel()
		i++
	}
	return after
}

// tokenOf returns the token of a term whose latch node has czxid: the
// epoch, read from b's epoch node through raw, <<32 + czxid.
func tokenOf(t testing.TB, raw *zk.Conn, b *zookeeper.Backend, czxid int64) uint64 {
	t.Helper()
	data, stat, err := raw.Get(b.EpochPath())
	if err != nil {
		t.Fatalf("epoch node %s: %v", b.EpochPath(), err)
	}
	if stat.EphemeralOwner != 0 {
		t.Errorf("epoch node %s is ephemeral", b.EpochPath())
	}
	e, err := epoch.Parse(string(data))
	if err != nil {
		t.Fatalf("epoch node %s: %v", b.EpochPath(), err)
	}
	return epoch.Token(e, uint64(czxid))
}
