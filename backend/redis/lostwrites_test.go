package redis_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testserver"
)

// TestRestoredSnapshotStartsNewEpoch: the server restarts from a snapshot
// older than the last acquisition, so the lease's token key goes back. A
// process that saw the later token says so at Error level and starts a
// new epoch: its next token is above every token it saw, not a repeat.
func TestRestoredSnapshotStartsNewEpoch(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	var logs testserver.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b := newBackend(t, newClient(t, srv.Addr(), ""), redis.Options{Config: backend.Config{TTL: time.Second}, Logger: log})
	ctx := context.Background()
	const lease = "restored"
	term := func() uint64 {
		t.Helper()
		tm, err := b.Campaign(ctx, lease, baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		if err := tm.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		return tm.Token()
	}
	first := term()
	srv.MustDo(t, "SAVE")
	second := term()
	if second != first+1 {
		t.Fatalf("tokens %d, %d: want consecutive", first, second)
	}
	if err := srv.Restart(); err != nil { // loads the snapshot: the token key says first
		t.Fatal(err)
	}
	if v := srv.MustDo(t, "GET", redis.KeysOf("", lease).Token); v != strconv.FormatUint(first, 10) {
		t.Fatalf("the token key after the restart is %v; want the snapshot's %d", v, first)
	}
	third := term()
	if third <= second {
		t.Errorf("token after the lost write: %d; want above %d", third, second)
	}
	if third>>32 <= second>>32 {
		t.Errorf("token %d is in epoch %d, not a new one above %d", third, third>>32, second>>32)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "REDIS LOST WRITES") {
		t.Errorf("no Error-level line about the lost writes; logs:\n%s", logs.String())
	}
}

// TestRestartWithoutPersistence: the server restarts empty (no
// persistence) while a holder, cut off at that moment, still acts until
// its safe-until. The lease key is gone, but the store's marker went with
// it, so no contender gets the lease until a TTL after the restart: after
// the old holder stopped.
func TestRestartWithoutPersistence(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	o := redis.Options{Config: backend.Config{TTL: 2 * time.Second}}
	proxy := testserver.StartProxy(t, srv.Addr())
	a := newBackend(t, newClient(t, proxy.Addr(), ""), o)
	b := newBackend(t, newClient(t, srv.Addr(), ""), o)
	ctx := context.Background()
	const lease = "restarted"
	ta, err := a.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	_, aEnded := hold("a", ta)
	proxy.Cut()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var tb baton.Term
	for {
		tb, err = b.Campaign(ctx, lease, baton.Candidate{ID: "b"})
		if err == nil {
			break
		}
		if !errors.Is(err, baton.ErrBackendUnavailable) {
			t.Fatal(err)
		}
	}
	bStart := time.Now()
	ai := <-aEnded
	if bStart.Before(ai.end) {
		t.Errorf("two holders at once: b (token %d) started %s before a (token %d) stopped", tb.Token(), ai.end.Sub(bStart), ai.token)
	}
	if tb.Token() <= ai.token {
		t.Errorf("tokens did not rise across the restart: %d, then %d", ai.token, tb.Token())
	}
}
