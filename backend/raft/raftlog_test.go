package raft

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// records returns the JSON records written so far.
func (b *lockedBuffer) records(t *testing.T) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.b.String()), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// hashicorp/raft's records keep their level (an ERROR is an error, a WARN a
// warning), and 97 heartbeat failures to one dead peer within the interval
// make one line, then one summary that counts the rest; another peer's
// failures are not counted with them.
func TestRaftLogLevelsAndRepeats(t *testing.T) {
	var buf lockedBuffer
	rl := newRaftLog(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), 300*time.Millisecond)
	h := rl.hclogger()
	h.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "10.0.0.1:7390")
	h.Info("entering follower state", "follower", "me")
	for i := range 97 {
		h.Error("failed to heartbeat to", "peer", "10.0.0.2:7390", "backoff time", time.Duration(i)*10*time.Millisecond, "error", errors.New("dial tcp 10.0.0.2:7390: connection refused"))
	}
	h.Error("failed to heartbeat to", "peer", "10.0.0.3:7390", "error", "dial tcp 10.0.0.3:7390: connection refused")

	count := func(msg string) (n int, rec map[string]any) {
		for _, r := range buf.records(t) {
			if r["msg"] == msg {
				n++
				rec = r
			}
		}
		return n, rec
	}
	if n, r := count("heartbeat timeout reached, starting election"); n != 1 || r["level"] != "WARN" {
		t.Errorf("raft's WARN: %d records, last %v; want one at WARN", n, r)
	}
	if n, r := count("entering follower state"); n != 1 || r["level"] != "DEBUG" || r["module"] != "raft" {
		t.Errorf("raft's INFO: %d records, last %v; want one at DEBUG with module raft", n, r)
	}
	if n, r := count("failed to heartbeat to"); n != 2 || r["level"] != "ERROR" {
		t.Errorf("raft's ERRORs: %d records, last %v; want two at ERROR (one per peer) before the interval ends", n, r)
	}
	testkit.Eventually(t, 10*time.Second, "the summary of the repeats", func() bool {
		n, _ := count("failed to heartbeat to (repeated)")
		return n == 1
	})
	_, r := count("failed to heartbeat to (repeated)")
	if r["level"] != "ERROR" || r["repeated"] != float64(96) || r["peer"] != "10.0.0.2:7390" || !strings.Contains(r["error"].(string), "connection refused") {
		t.Errorf("summary %v: want ERROR, repeated 96, peer 10.0.0.2:7390 and the error", r)
	}
	// After the summary, the next failure waits for the next interval.
	h.Error("failed to heartbeat to", "peer", "10.0.0.2:7390", "error", "dial tcp 10.0.0.2:7390: connection refused")
	rl.close()
	if n, _ := count("failed to heartbeat to (repeated)"); n != 2 {
		t.Errorf("%d summaries after close, want 2: close writes the one due", n)
	}
	if n, _ := count("failed to heartbeat to"); n != 2 {
		t.Errorf("%d first records after the summary, want still 2", n)
	}
}

// A failure of another kind on the same peer is its own record, at once:
// repeats of one error are counted, but a new error (the peer now refuses
// this member's secret, say) is not folded into the count of an old one,
// where only the last of them would show. Numbers in the error, such as a
// connection's ephemeral port, do not make it another error.
func TestRaftLogKeepsDistinctErrors(t *testing.T) {
	var buf lockedBuffer
	rl := newRaftLog(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), time.Hour)
	defer rl.close()
	h := rl.hclogger()
	const peer = "10.0.0.2:7390"
	for port := range 20 {
		h.Error("failed to appendEntries to", "peer", peer, "error", fmt.Sprintf("read tcp 10.0.0.1:%d->10.0.0.2:7390: i/o timeout", 40000+port))
	}
	h.Error("failed to appendEntries to", "peer", peer, "error", "raft: dial 10.0.0.2:7390: raft: the group refused this member's secret: 10.0.0.2:7390 refused it")
	h.Error("failed to appendEntries to", "peer", peer, "error", "read tcp 10.0.0.1:40100->10.0.0.2:7390: i/o timeout")
	var errs []string
	for _, r := range buf.records(t) {
		if r["msg"] == "failed to appendEntries to" {
			errs = append(errs, r["error"].(string))
		}
	}
	if len(errs) != 2 || !strings.Contains(errs[0], "i/o timeout") || !strings.Contains(errs[1], "refused this member's secret") {
		t.Fatalf("records written: %q; want the timeout once, then the refusal of the secret (the timeouts that differ only in a port counted)", errs)
	}
}
