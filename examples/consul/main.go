// Command consul is a small leader-elected worker on Consul: run it twice
// against one agent and one of the two does the work while the other
// waits; stop the leader (Ctrl-C) and the other takes over at once; kill it
// (kill -9) and the other takes over after the TTL.
//
//	consul agent -dev &
//	go run ./examples/consul -id one &
//	go run ./examples/consul -id two
//
// `consul lock baton/example CMD` contends for the same lease: it waits
// while one of these leads, and they wait while it runs CMD.
//
// The agent is found as the consul CLI finds it (CONSUL_HTTP_ADDR, ACL
// token in CONSUL_HTTP_TOKEN, CONSUL_CACERT and friends for TLS), or from
// -addr. Consul refuses session TTLs below its session_ttl_min (10 s by
// default), and baton asks for TTL/2, so -ttl must be at least 20s unless
// the agent's minimum is lowered.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
)

func main() {
	if err := run(); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		addr  = flag.String("addr", "", "Consul agent address (default: CONSUL_HTTP_ADDR or 127.0.0.1:8500)")
		lease = flag.String("lease", "example", "lease name; held at baton/LEASE/.lock")
		id    = flag.String("id", "", "candidate ID (default: host name and a random suffix)")
		ttl   = flag.Duration("ttl", consul.DefaultTTL, "failover time after a crash")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	client, err := consul.NewClient(consul.ClientConfig{Address: *addr})
	if err != nil {
		return err
	}
	b, err := consul.New(client, consul.Options{Config: backend.Config{TTL: *ttl}, Logger: log})
	if err != nil {
		return err
	}
	// Closing deletes the lock and destroys the session, so that a standby
	// takes over at once rather than after the TTL.
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("%s campaigning for %q\n", e.ID(), *lease)
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
