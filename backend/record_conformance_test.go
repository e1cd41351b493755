package backend_test

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/batontest"
)

// The suite over a store without push notifications: waiters wake by
// polling only. (backend/memory runs it with notifications.)
func TestConformancePolling(t *testing.T) {
	store := memory.NewStore()
	batontest.Run(t, batontest.Target{New: func(t *testing.T, cfg backend.Config) *batontest.Process {
		conn := store.Connect()
		polling := conn.Polling()
		if _, ok := polling.(backend.RecordNotifier); ok {
			t.Fatal("Conn.Polling must not implement backend.RecordNotifier")
		}
		b, err := backend.NewRecordBackend(polling, backend.RecordOptions{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = b.Close(ctx)
		})
		return &batontest.Process{Backend: b, Kill: conn.Disconnect, Cut: conn.Disconnect, Heal: conn.Reconnect}
	}})
}
