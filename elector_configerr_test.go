package baton_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
)

// refusingBackend is a memory backend whose campaigns fail with err.
type refusingBackend struct {
	*memory.Backend
	err   error
	tries int
}

func (b *refusingBackend) Campaign(context.Context, string, baton.Candidate) (baton.Term, error) {
	b.tries++
	return nil, b.err
}

// TestElectorReturnsConfigError: a campaign refused for a configuration
// that no retry fixes (a *ConfigError anywhere in the chain) ends Run with
// that error, where other failures are retried.
func TestElectorReturnsConfigError(t *testing.T) {
	t.Parallel()
	mb, err := memory.New(memory.NewStore(), memory.Options{Config: testCfg})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close(context.Background())
	refused := fmt.Errorf("create session: %w", &baton.ConfigError{Problems: []string{"session TTL below the minimum"}})
	b := &refusingBackend{Backend: mb, err: refused}
	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "l", Candidate: baton.Candidate{ID: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = e.Run(ctx, func(context.Context, baton.Term) error { return nil })
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || ctx.Err() != nil {
		t.Fatalf("Run = %v (ctx %v); want the campaign's ConfigError", err, ctx.Err())
	}
	if b.tries != 1 {
		t.Errorf("%d campaigns; want 1: a configuration error is not retried", b.tries)
	}
}
