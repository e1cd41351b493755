package bench

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

func init() { targets = append(targets, namedTarget{"zookeeper", zookeeperTarget}) }

// zookeeperTarget runs against one real ZooKeeper 3.8 (Debian's, standalone
// on loopback); every simulated process has its own session behind its own
// proxy, so that killing a process cuts it off without closing its session,
// as kill -9 would.
func zookeeperTarget(b *testing.B) target {
	srv := testserver.StartZooKeeper(b, testserver.ZooKeeperOptions{})
	var n atomic.Int64
	return target{
		name: "zookeeper",
		new: func(b *testing.B, cfg backend.Config) *process {
			proxy := testserver.StartProxy(b, srv.Addr())
			// Count every request frame the client sends (pings
			// included): go-zookeeper writes each in one Write.
			probe := zookeeper.NewSessionProbe(func(network, addr string, timeout time.Duration) (net.Conn, error) {
				c, err := net.DialTimeout(network, addr, timeout)
				if err != nil {
					return nil, err
				}
				return countingConn{c, &n}, nil
			})
			timing, err := cfg.WithDefaults() // the session timeout is the TTL
			if err != nil {
				b.Fatal(err)
			}
			// The Backend follows its held nodes through the connection's
			// event callback, as a Backend from Dial does.
			watches := zookeeper.NewWatches()
			conn, _, err := zk.Connect([]string{proxy.Addr()}, timing.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quietZK{}), zk.WithEventCallback(watches.Callback))
			if err != nil {
				b.Fatal(err)
			}
			be, err := zookeeper.New(conn, zookeeper.Options{Config: cfg, Probe: probe, Watches: watches})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = be.Close(ctx)
				conn.Close()
			})
			return &process{backend: be, kill: proxy.Cut}
		},
		requests: n.Load,
	}
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

type quietZK struct{}

func (quietZK) Printf(string, ...any) {}
