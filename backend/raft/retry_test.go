package raft

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// A renewal refused because the group has no raft leader is retried, and
// each refusal is logged at debug level: without the lines, a session that
// expires while its member waits for a leader shows nothing for a TTL.
func TestRefusedRenewalsAreLogged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	calls := 0
	v, err := retryNotLeaderLogged(context.Background(), log, "session renewal", func(context.Context) (int, error) {
		if calls++; calls < 3 {
			return 0, fmt.Errorf("member m2: %w", ErrNotLeader)
		}
		return 7, nil
	})
	if err != nil || v != 7 {
		t.Fatalf("retryNotLeaderLogged = %d, %v; want 7, nil", v, err)
	}
	if n := strings.Count(buf.String(), "session renewal refused: no raft leader"); n != 2 {
		t.Errorf("%d refusals logged, want 2 (one per refused attempt):\n%s", n, buf.String())
	}
}
