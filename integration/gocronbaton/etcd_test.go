package gocronbaton_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/gocronbaton"
	"github.com/batonhq/baton/integration/internal/clients"
	"github.com/batonhq/baton/internal/testserver"
)

// On a real etcd: a gocron job name with "/" (the default name of a job is
// its function's import path) maps to a valid election name, a second
// instance fails fast, and Unlock hands the lease over after Hold.
func TestLockerEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd server")
	}
	srv := testserver.StartEtcd(t)
	var lockers []*gocronbaton.Locker
	for _, id := range []string{"a", "b"} {
		b, err := etcd.New(clients.Etcd(t, srv.Endpoint()), etcd.Options{Config: backend.Config{TTL: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		l, err := gocronbaton.NewLocker(b, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: id}, Hold: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		lockers = append(lockers, l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const key = "github.com/acme/app.nightlyReport"
	lk, err := lockers[0].Lock(ctx, key)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if _, err := lockers[1].Lock(ctx, key); !errors.Is(err, gocronbaton.ErrLocked) {
		t.Fatalf("Lock held by another instance: %v, want ErrLocked", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	for {
		lk, err := lockers[1].Lock(ctx, key)
		if err == nil {
			_ = lk.Unlock(ctx)
			return
		}
		if !errors.Is(err, gocronbaton.ErrLocked) {
			t.Fatalf("Lock after the holder's Unlock: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
