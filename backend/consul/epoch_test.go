package consul_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/epoch"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// TestTokensRiseAcrossRestartedConsul is the attack of a Consul that loses
// its data under a running process: a -dev agent (it keeps everything in
// memory) stopped and started again behind the same address, so its raft
// indexes start again from the bottom. Tokens must keep rising, for the
// same Backend (which logs the loss) and for a new one.
func TestTokensRiseAcrossRestartedConsul(t *testing.T) {
	srv := testserver.StartConsul(t, testserver.ConsulOptions{})
	proxy := testserver.StartProxy(t, srv.Addr())
	client := agentClient(t, srv, proxy.Addr())
	prefix := testPrefix()
	gone := make(chan struct{}) // its agent may be gone: Close may fail
	close(gone)
	batontest.TokensRiseAcrossDataLoss(t, batontest.DataLoss{
		New: func(t *testing.T, logger *slog.Logger) baton.Backend {
			return newBackend(t, client, consul.Options{Config: backend.Config{TTL: 2 * time.Second}, Prefix: prefix, Logger: logger}, gone)
		},
		Lose: func(t *testing.T) {
			srv.Close()
			srv = testserver.StartConsul(t, testserver.ConsulOptions{})
			proxy.Retarget(srv.Addr())
		},
	})
}

// tokenAt returns the token of a term of lease name that locked its key at
// index: the lease's epoch, read from its epoch key, <<32 + index.
func tokenAt(t *testing.T, c *api.Client, b *consul.Backend, name string, index uint64) uint64 {
	t.Helper()
	key, err := b.EpochKey(name)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := c.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
	if err != nil || p == nil {
		t.Fatalf("epoch key %s: %+v, %v", key, p, err)
	}
	if p.Session != "" || p.Flags != 0 {
		t.Errorf("epoch key %s = %+v; want no session, no flags", key, p)
	}
	e, err := epoch.Parse(string(p.Value))
	if err != nil {
		t.Fatalf("epoch key %s: %v", key, err)
	}
	return epoch.Token(e, index)
}
