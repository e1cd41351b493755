package batontest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// DataLoss describes a backend whose store can lose all its data, for
// TokensRiseAcrossDataLoss.
type DataLoss struct {
	// New starts a new process against the store: a Backend with its own
	// connection and session, logging to logger. It registers its own
	// clean-up with t.Cleanup. If the Backend has a method
	// Close(context.Context) error, the test calls it once done with the
	// Backend and fails on its error.
	New func(t *testing.T, logger *slog.Logger) baton.Backend
	// Lose makes the real store lose all its data, so that its own counter
	// starts again from the bottom, and be back behind the address the
	// Backends use: for example, the server stopped, its data directory
	// wiped, and a new one started in its place. A Backend that campaigns
	// after Lose returned may fail a few times, as a process's would.
	Lose func(t *testing.T)
	// NewProcessOnly says that a process that saw the store before the loss
	// cannot campaign after it (a ZooKeeper client refuses a server whose
	// zxid is below the one it saw), and skips the part of the test that
	// campaigns on the same Backend across the loss.
	NewProcessOnly bool
}

// TokensRiseAcrossDataLoss is the attack of a store that loses its data
// under its users: a candidate campaigns, the store loses its data, and a
// candidate campaigns again, on the same Backend (unless NewProcessOnly)
// and on a new one. Every token must be above every earlier one, and the
// same Backend must log a warning that the epoch changed. The new process
// knows no earlier epoch: it relies on the documented assumption that it
// runs in a later second, by the wall clock, than the old epoch.
func TokensRiseAcrossDataLoss(t *testing.T, s DataLoss) {
	lease := leaseName(t)
	logs := &Log{Level: slog.LevelWarn}
	b := s.New(t, slog.New(logs))
	last := termsOn(t, b, lease, 5, 0)
	lastAt := time.Now()
	if !s.NewProcessOnly {
		s.Lose(t)
		first := termsOn(t, b, lease, 1, last)
		if !logs.Contains("epoch changed") {
			t.Errorf("no warning that the store lost its data; logged: %q", logs.Messages())
		}
		t.Logf("same process: token %d (%#x) before the loss, %d (%#x) after", last, last, first, first)
		last = termsOn(t, b, lease, 3, first)
		lastAt = time.Now()
	}
	closeBackend(t, b)
	// The documented assumption: the new epoch's writer has a clock past
	// the old epoch (the token's high half), which the same process's
	// rewrite above may have set a second ahead of the clock.
	testkit.Eventually(t, 3*time.Second, "the wall clock to pass the last epoch", func() bool {
		now := backend.EpochOf(time.Now())
		return now > backend.EpochOf(lastAt) && now > last>>32
	})
	s.Lose(t)
	b2 := s.New(t, slog.New(&Log{Level: slog.LevelWarn}))
	first := termsOn(t, b2, lease, 1, last)
	t.Logf("new process: token %d (%#x) before the loss, %d (%#x) after", last, last, first, first)
	closeBackend(t, b2)
}

// termsOn takes lease n times on b, checking that Leader reports each term
// and, once it is resigned, no leader, and that every token is above after
// (and the one before it); it returns the last token. Failed campaigns are
// retried, as the Elector does: after the store lost its data, a Backend's
// session is gone and its first campaigns may fail.
func termsOn(t *testing.T, b baton.Backend, lease string, n int, after uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < n; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		term, err := b.Campaign(ctx, lease, baton.Candidate{ID: "c"})
		cancel()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("campaign: %v", err)
			}
			time.Sleep(50 * time.Millisecond) // the Elector's back-off
			continue
		}
		if term.Token() <= after {
			t.Fatalf("token %d (%#x) is not above %d (%#x)", term.Token(), term.Token(), after, after)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		rec, err := b.Leader(ctx, lease)
		if err != nil || rec.Token != term.Token() {
			cancel()
			t.Fatalf("Leader = %+v, %v; want token %d", rec, err, term.Token())
		}
		after = term.Token()
		resign(t, term)
		if rec, err := b.Leader(ctx, lease); !errors.Is(err, baton.ErrNoLeader) {
			cancel()
			t.Fatalf("Leader after resign = %+v, %v; want ErrNoLeader", rec, err)
		}
		cancel()
		i++
	}
	return after
}

// closeBackend closes b if it has a Close method, failing t on its error.
func closeBackend(t *testing.T, b baton.Backend) {
	t.Helper()
	c, ok := b.(interface{ Close(context.Context) error })
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// Log is a slog.Handler that keeps the messages logged at Level and above,
// for tests that check what a component logged. Its zero value keeps Info
// and above. It is safe for concurrent use.
type Log struct {
	// Level is the lowest level kept.
	Level slog.Level

	mu   sync.Mutex
	msgs []string
}

// Enabled reports whether l keeps messages at lv.
func (l *Log) Enabled(_ context.Context, lv slog.Level) bool { return lv >= l.Level }

// Handle keeps r's message.
func (l *Log) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}

// WithAttrs returns l: it keeps messages only.
func (l *Log) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup returns l: it keeps messages only.
func (l *Log) WithGroup(string) slog.Handler { return l }

// Messages returns the messages kept so far, oldest first.
func (l *Log) Messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// Contains reports whether a message kept so far contains sub.
func (l *Log) Contains(sub string) bool {
	for _, m := range l.Messages() {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}
