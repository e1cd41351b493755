package etcd

import (
	"testing"

	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testClient returns a client for the etcd at endpoint (a server's Endpoint,
// or a Proxy's Addr to get a client that can be cut off), closed when the
// test ends. It lives in this module's tests rather than in
// internal/testserver, which stays stdlib-only so that etcd's client is in
// no other module's graph.
func testClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: testserver.ClientDialTimeout,
		// The client logs every reconnect attempt, which partition tests
		// provoke on purpose.
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

// NewTestClient gives the external tests (package etcd_test) testClient.
var NewTestClient = testClient
