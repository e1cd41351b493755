package main

import (
	"testing"

	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdClient returns a client for the etcd at endpoint, closed when the test
// ends. internal/testserver stays stdlib-only, so the modules whose tests
// need etcd's client build it themselves.
func etcdClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: testserver.ClientDialTimeout,
		// The client logs every reconnect attempt.
		Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client for %s: %v", endpoint, err)
	}
	t.Cleanup(func() {
		// Close cancels the client's streams; its error only repeats that.
		_ = c.Close()
	})
	return c
}
