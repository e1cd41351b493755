package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/batontest"
)

func TestConformance(t *testing.T) {
	store := memory.NewStore()
	batontest.Run(t, batontest.Target{New: func(t *testing.T, cfg backend.Config) *batontest.Process {
		b, err := memory.New(store, memory.Options{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = b.Close(ctx)
		})
		return &batontest.Process{Backend: b, Kill: b.Disconnect, Cut: b.Disconnect, Heal: b.Reconnect}
	}})
}
