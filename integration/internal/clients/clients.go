// Package clients builds the typed clients that the cross-module tests use
// against the servers of internal/testserver. internal/testserver itself
// stays stdlib-only, so that no library module's graph gets a backend's
// client through its test tooling; this module is a leaf that nothing
// imports.
package clients

import (
	"testing"

	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd returns a client for the etcd at endpoint (a server's Endpoint, or a
// Proxy's Addr to get a client that can be cut off), closed when the test
// ends.
func Etcd(t testing.TB, endpoint string) *clientv3.Client {
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

// Consul returns an API client for agent at addr (the agent's Addr, or a
// Proxy's in front of it), with the management token when the agent has
// ACLs and the agent's CA and client certificate when it has TLS. Clients
// hold no resources that need closing.
func Consul(t testing.TB, agent *testserver.Consul, addr string) *api.Client {
	t.Helper()
	cfg := &api.Config{Address: addr, Scheme: "http", Token: agent.ManagementToken()}
	if caFile, certFile, keyFile := agent.TLSFiles(); caFile != "" {
		cfg.Scheme = "https"
		cfg.TLSConfig = api.TLSConfig{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		t.Fatalf("consul client for %s: %v", addr, err)
	}
	return client
}
