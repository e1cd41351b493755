package zookeeper_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/batontest"
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
	batontest.TokensRiseAcrossDataLoss(t, batontest.DataLoss{
		New: func(t *testing.T, logger *slog.Logger) baton.Backend {
			return dial(t, proxy.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: backend.Config{TTL: 2 * time.Second}, Logger: logger}})
		},
		Lose: func(t *testing.T) {
			srv.Close()
			srv = testserver.StartZooKeeper(t, testserver.ZooKeeperOptions{})
			proxy.Retarget(srv.Addr())
		},
		NewProcessOnly: true,
	})
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
	e, err := backend.ParseEpoch(string(data))
	if err != nil {
		t.Fatalf("epoch node %s: %v", b.EpochPath(), err)
	}
	return backend.EpochToken(e, uint64(czxid))
}
