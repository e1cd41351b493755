package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// commandStats returns the server's calls per command since the last
// CONFIG RESETSTAT.
func commandStats(t *testing.T, srv *testserver.Redis) map[string]int {
	t.Helper()
	info, _ := srv.MustDo(t, "INFO", "commandstats").(string)
	out := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, _ := strconv.Atoi(calls)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// TestOneRoundTripPerRenewal: a process holding 200 leases renews them
// all with one script call per RenewInterval.
func TestOneRoundTripPerRenewal(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	b := newBackend(t, newClient(t, srv.Addr(), ""), redis.Options{Config: backend.Config{TTL: time.Second}, NoPubSub: true})
	const n = 200
	ctx := context.Background()
	for i := range n {
		if _, err := b.Campaign(ctx, fmt.Sprintf("many-%d", i), baton.Candidate{ID: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	srv.MustDo(t, "CONFIG", "RESETSTAT")
	testkit.Eventually(t, 30*time.Second, "three renewals", func() bool { return commandStats(t, srv)["evalsha"] >= 3 })
	st := commandStats(t, srv)
	e, p := st["evalsha"], st["pexpire"]
	// Between the two reads a renewal may have begun: each renews all n.
	if p != n*e && p != n*(e-1) && p != n*(e+1) {
		t.Errorf("%d script calls renewed %d keys: want %d keys per call (one round trip renews every lease)", e, p, n)
	}
	for cmd := range st {
		switch cmd {
		case "evalsha", "get", "pexpire", "info", "config|resetstat":
		case "script|load": // the renewal script's first use
			if st[cmd] > 1 {
				t.Errorf("SCRIPT LOAD ran %d times", st[cmd])
			}
		default:
			t.Errorf("command %s ran while the process only renewed (%d calls)", cmd, st[cmd])
		}
	}
}

// TestScriptFlushReloads: after SCRIPT FLUSH (as after a restart or a
// failover to a server that never ran the scripts), EVALSHA fails with
// NOSCRIPT, and the Backend loads the script again: the term goes on.
func TestScriptFlushReloads(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	b := newBackend(t, newClient(t, srv.Addr(), ""), redis.Options{Config: backend.Config{TTL: time.Second}})
	term, err := b.Campaign(context.Background(), "flushed", baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	first := term.SafeUntil()
	srv.MustDo(t, "SCRIPT", "FLUSH")
	testkit.Eventually(t, 30*time.Second, "a renewal after SCRIPT FLUSH", func() bool { return term.SafeUntil().After(first.Add(time.Second / 2)) })
	if err := term.Err(); err != nil {
		t.Fatalf("the term ended: %v", err)
	}
	if commandStats(t, srv)["script|load"] == 0 {
		t.Error("no SCRIPT LOAD after the flush")
	}
}

// TestClusterRefused: a server with cluster mode on is refused with
// ErrCluster, a *baton.ConfigError.
func TestClusterRefused(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{Config: []string{"cluster-enabled yes"}})
	_, err := redis.New(context.Background(), newClient(t, srv.Addr(), ""), redis.Options{})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "Redis Cluster is not supported") {
		t.Fatalf("New on a cluster node: %v; want a *baton.ConfigError naming Redis Cluster", err)
	}
}
