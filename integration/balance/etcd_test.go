package balance_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/balance"
	"github.com/batonhq/baton/integration/internal/clients"
	"github.com/batonhq/baton/internal/balancetest"
	"github.com/batonhq/baton/internal/testserver"
)

// The balance property on a real etcd (embedded): the member slots' names
// must be valid etcd election names, a session backend frees a dead
// member's slot by itself, and the bound holds after a kill.
func TestEtcdBalance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd server")
	}
	srv := testserver.StartEtcd(t)
	rb, err := etcd.New(clients.Etcd(t, srv.Endpoint()), etcd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.Close(context.Background()) })
	w := balancetest.NewWorld(t, 15, rb)
	var procs []*balancetest.Proc
	for i := range 3 {
		// Each process reaches etcd through a proxy of its own, so that it
		// can be cut off alone.
		proxy := testserver.StartProxy(t, srv.Endpoint())
		client := clients.Etcd(t, proxy.Addr())
		b, err := etcd.New(client, etcd.Options{Config: backend.Config{TTL: time.Second, RenewInterval: 200 * time.Millisecond, DriftMargin: 300 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = b.Close(ctx) // a killed process's revoke fails: that says nothing
		})
		g, err := balance.New(b, balancetest.Config(fmt.Sprintf("e%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		procs = append(procs, w.Start(g, func() {
			// kill -9: the session is never revoked; etcd expires it.
			once.Do(func() {
				proxy.Cut()
				_ = client.Close()
			})
		}))
	}
	w.AwaitSteady(procs, 5, 5, 30*time.Second)

	procs[0].Kill()
	w.AwaitSteady(procs[1:], 15/2, 8, 30*time.Second)
	w.CheckNoOverlap()
}
