package testserver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton/integration/internal/clients"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestEtcdPutGet(t *testing.T) {
	e := testserver.StartEtcd(t)
	c := clients.Etcd(t, e.Endpoint())
	ctx := testkit.Context(t, 10*time.Second)

	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	resp, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get k = %v, want v", resp.Kvs)
	}
}

// A one-second lease is what failover tests rely on; etcd raises TTLs below
// its minimum without an error, so check the grant rather than trust it.
func TestEtcdShortLeaseGranted(t *testing.T) {
	e := testserver.StartEtcd(t)
	c := clients.Etcd(t, e.Endpoint())

	resp, err := c.Grant(testkit.Context(t, 10*time.Second), 1)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	if resp.TTL != 1 {
		t.Fatalf("granted TTL = %ds, want 1s", resp.TTL)
	}
}

// A restart on the same dir after Close brings back the keys and the live
// leases (etcd's sessions), with the key still attached to its lease.
func TestEtcdRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	e, err := testserver.NewEtcd(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := clients.Etcd(t, e.Endpoint())
	if _, err := c.Put(testkit.Context(t, 10*time.Second), "k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	lease, err := c.Grant(testkit.Context(t, 10*time.Second), 60)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	if _, err := c.Put(testkit.Context(t, 10*time.Second), "leased", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("put with lease: %v", err)
	}
	c.Close()
	e.Close()
	e.Close() // must be harmless: tests close early and cleanups close again

	e, err = testserver.NewEtcd(dir)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer e.Close()
	c = clients.Etcd(t, e.Endpoint())
	defer c.Close()
	resp, err := c.Get(testkit.Context(t, 10*time.Second), "k")
	if err != nil {
		t.Fatalf("get after restart: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get k after restart = %v, want v", resp.Kvs)
	}
	ttl, err := c.TimeToLive(testkit.Context(t, 10*time.Second), lease.ID)
	if err != nil || ttl.TTL <= 0 {
		t.Errorf("lease %x after restart: %+v, %v; want it alive", lease.ID, ttl, err)
	}
	resp, err = c.Get(testkit.Context(t, 10*time.Second), "leased")
	if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != lease.ID {
		t.Errorf("leased key after restart: %v, %v; want attached to lease %x", resp, err, lease.ID)
	}
}

func TestProxyCutAndHeal(t *testing.T) {
	e := testserver.StartEtcd(t)
	p := testserver.StartProxy(t, e.Endpoint())
	direct := clients.Etcd(t, e.Endpoint())
	proxied := clients.Etcd(t, p.Addr())

	if err := get(proxied, 5*time.Second); err != nil {
		t.Fatalf("get through proxy: %v", err)
	}

	p.Cut()
	if err := get(proxied, 500*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get through cut proxy: err = %v, want deadline exceeded", err)
	}
	if err := get(direct, 5*time.Second); err != nil {
		t.Fatalf("direct get while proxy cut: %v", err)
	}

	p.Heal()
	testkit.EventuallyErr(t, 15*time.Second, "a get through the healed proxy", func() error { return get(proxied, 500*time.Millisecond) })
}

func TestProxyCloseIdempotent(t *testing.T) {
	e := testserver.StartEtcd(t)
	p, err := testserver.NewProxy(e.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	c := clients.Etcd(t, p.Addr())
	if err := get(c, 5*time.Second); err != nil {
		t.Fatalf("get through proxy: %v", err)
	}
	p.Cut() // leave a held connection behind for Close to reap
	_ = get(c, 100*time.Millisecond)
	p.Close()
	p.Close()
}

func get(c *clientv3.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := c.Get(ctx, "k")
	return err
}
