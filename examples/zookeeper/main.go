// Command zookeeper is a small leader-elected worker on ZooKeeper: run it
// twice against one server and one of the two does the work while the other
// waits; stop the leader (Ctrl-C) and the other takes over at once; kill it
// (kill -9) and the other takes over once ZooKeeper expires its session,
// after the TTL.
//
//	zkServer.sh start   # or: /usr/share/zookeeper/bin/zkServer.sh start
//	go run ./examples/zookeeper -id one &
//	go run ./examples/zookeeper -id two
//
// A JVM service running Curator's LeaderLatch on the latch path this
// prints (/baton/example by default) contends for the same lease, and each
// side sees the other as leader while it leads.
//
// ZooKeeper grants session timeouts between its minSessionTimeout and
// maxSessionTimeout (by default 2 and 20 ticks of 2 s: 4 s to 40 s); the
// example times its terms by what the server granted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
)

func main() {
	if err := run(); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		servers = flag.String("servers", "127.0.0.1:2181", "comma-separated ZooKeeper servers, host:port")
		root    = flag.String("root", zookeeper.DefaultRoot, "ZooKeeper path under which each lease has its latch path")
		lease   = flag.String("lease", "example", "lease name; its latch path is ROOT/LEASE")
		id      = flag.String("id", "", "candidate ID (default: host name and a random suffix)")
		ttl     = flag.Duration("ttl", 6*time.Second, "session timeout: failover time after a crash")
		digest  = flag.String("digest", "", "user:password for ZooKeeper's digest authentication")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	b, err := zookeeper.Dial(dctx, strings.Split(*servers, ","), zookeeper.DialOptions{
		Options: zookeeper.Options{Config: backend.Config{TTL: *ttl}, Root: *root, Logger: log},
		Digest:  *digest,
	})
	cancel()
	if err != nil {
		return err
	}
	// Closing closes the session, which deletes our latch node at once, so
	// that a standby takes over without waiting for the session to expire.
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			log.Warn("close", "err", err)
		}
	}()

	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: *lease, Candidate: baton.Candidate{ID: *id}, Logger: log})
	if err != nil {
		return err
	}
	fmt.Printf("%s campaigning for %q on latch path %s\n", e.ID(), *lease, b.LatchPath(*lease))
	return e.Run(ctx, func(ctx context.Context, t baton.Term) error {
		fmt.Printf("%s leads with token %d\n", e.ID(), t.Token())
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				// The term ended, or we are shutting down: stop acting now.
				why := t.Err()
				if why == nil {
					why = context.Cause(ctx)
				}
				fmt.Printf("%s stops leading: %v\n", e.ID(), why)
				return nil
			case <-tick.C:
				// Leader-only work goes here; send t.Token() with every write
				// to downstream stores so that they can fence off a stale leader.
				fmt.Printf("%s working (token %d, safe for %s)\n", e.ID(), t.Token(), time.Until(t.SafeUntil()).Round(time.Millisecond))
			}
		}
	})
}
