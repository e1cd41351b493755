package etcd_test

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testserver"
)

// TestTokensRiseAcrossWipedEtcd is the attack of an etcd that loses its
// data under a running process: stopped, its data directory wiped, and
// restarted on the same address, so its revisions start again at 1. Tokens
// must keep rising, for the same Backend (which logs the loss) and for a
// new one.
func TestTokensRiseAcrossWipedEtcd(t *testing.T) {
	srv := testserver.StartEtcd(t)
	dir, addr := srv.Dir(), srv.Endpoint()
	t.Cleanup(func() { srv.Close() })
	client := etcd.NewTestClient(t, addr)
	batontest.TokensRiseAcrossDataLoss(t, batontest.DataLoss{
		New: func(t *testing.T, logger *slog.Logger) baton.Backend {
			return newBackend(t, client, etcd.Options{Config: backend.Config{TTL: 2 * time.Second}, Logger: logger})
		},
		Lose: func(t *testing.T) {
			srv.Close()
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			var err error
			if srv, err = testserver.NewEtcdAt(dir, addr); err != nil {
				t.Fatalf("restart etcd on %s: %v", addr, err)
			}
		},
	})
}
