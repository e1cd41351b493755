package baton_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/batontest"
)

// wipeable is a backend whose store can be lost: each Wipe puts the
// campaigns on a fresh memory store, whose tokens start again at 1, as a
// store without an epoch would after losing its data.
type wipeable struct {
	mu sync.Mutex
	b  *memory.Backend
}

func (w *wipeable) Wipe(t *testing.T) {
	b, err := memory.New(memory.NewStore(), memory.Options{Config: testCfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	w.mu.Lock()
	w.b = b
	w.mu.Unlock()
}

func (w *wipeable) current() *memory.Backend {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b
}

func (w *wipeable) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	return w.current().Campaign(ctx, name, c)
}

func (w *wipeable) Leader(ctx context.Context, name string) (baton.Record, error) {
	return w.current().Leader(ctx, name)
}

// TestElectorReportsTokensGoingBack: a backend whose tokens go backwards
// (its store lost its data, and nothing folded an epoch in) is reported
// at Error, and Status shows the highest token beside the current one.
func TestElectorReportsTokensGoingBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &wipeable{}
		w.Wipe(t)
		logs := &batontest.Log{Level: slog.LevelError}
		e, err := baton.NewElector(w, baton.ElectorConfig{Lease: "job", Logger: slog.New(logs)})
		if err != nil {
			t.Fatal(err)
		}
		var tokens []uint64
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		_ = e.Run(ctx, func(_ context.Context, term baton.Term) error {
			tokens = append(tokens, term.Token())
			switch len(tokens) {
			case 1: // 1, then 2 on the same store
			case 2:
				w.Wipe(t) // the next term starts again at 1
			case 3:
				cancel()
			}
			return nil
		})
		if len(tokens) != 3 || tokens[2] >= tokens[1] {
			t.Fatalf("tokens %v: the test's backend should have gone back", tokens)
		}
		if !logs.Contains("fencing token did not increase") {
			t.Errorf("no error logged for tokens %v; logged %q", tokens, logs.Messages())
		}
		if s := e.Status(); s.Token != tokens[2] || s.HighestToken != tokens[1] {
			t.Errorf("Status: Token %d, HighestToken %d; want %d and %d", s.Token, s.HighestToken, tokens[2], tokens[1])
		}
	})
}
