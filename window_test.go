package baton_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
)

// windowed is a Backend that answers its renewal window.
type windowed struct {
	baton.Backend
	window time.Duration
}

func (b windowed) RenewalWindow() time.Duration { return b.window }

// NewElector refuses a StopEarly that does not fit in the backend's renewal
// window, which would stop every term as soon as it began, and accepts one
// below it.
func TestNewElectorChecksStopEarlyAgainstTheRenewalWindow(t *testing.T) {
	mem, err := memory.New(memory.NewStore(), memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close(t.Context())
	b := windowed{Backend: mem, window: 5 * time.Second}
	_, err = baton.NewElector(b, baton.ElectorConfig{Lease: "l", StopEarly: 5 * time.Second})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "renewal window (5s)") {
		t.Fatalf("StopEarly equal to the renewal window: %v, want a ConfigError naming the window", err)
	}
	if _, err := baton.NewElector(b, baton.ElectorConfig{Lease: "l", StopEarly: 4 * time.Second}); err != nil {
		t.Fatalf("StopEarly below the renewal window: %v", err)
	}
}
