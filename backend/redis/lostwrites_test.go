package redis_test

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testserver"
)

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRestoredSnapshotStartsNewEpoch: the server restarts from a snapshot
// older than the last acquisition, so the lease's token key goes back. A
// process that saw the later token says so at Error level and starts a
// new epoch: its next token is above every token it saw, not a repeat.
func TestRestoredSnapshotStartsNewEpoch(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	var logs lockedBuffer
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
