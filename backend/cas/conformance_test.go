package cas_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/cas"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/batontest"
)

// pollingStore hides the memory store's notifications, so the suite runs the
// lease loop as it works over a store without push notices: waiters wake by
// polling only.
type pollingStore struct {
	s    *memory.Store
	down *atomic.Bool
}

func (p pollingStore) Get(ctx context.Context, name string) (cas.Record, uint64, error) {
	if p.down.Load() {
		return cas.Record{}, 0, memory.ErrDisconnected
	}
	return p.s.Get(ctx, name)
}

func (p pollingStore) CompareAndSwap(ctx context.Context, name string, v uint64, r cas.Record) (uint64, error) {
	if p.down.Load() {
		return 0, memory.ErrDisconnected
	}
	return p.s.CompareAndSwap(ctx, name, v, r)
}

func TestConformancePolling(t *testing.T) {
	store := memory.NewStore()
	batontest.Run(t, batontest.Target{New: func(t *testing.T, cfg baton.Config) *batontest.Process {
		down := new(atomic.Bool)
		b, err := cas.New(pollingStore{store, down}, cas.Options{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := any(pollingStore{}).(cas.Notifier); ok {
			t.Fatal("pollingStore must not implement cas.Notifier")
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = b.Close(ctx)
		})
		return &batontest.Process{
			Backend: b,
			Kill:    func() { down.Store(true) },
			Cut:     func() { down.Store(true) },
			Heal:    func() { down.Store(false) },
		}
	}})
}
