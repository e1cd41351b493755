package consul_test

import (
	"testing"

	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// agentClient returns an API client for agent at addr (the agent's Addr, or
// a Proxy's in front of it), with the management token when the agent has
// ACLs and the agent's CA and client certificate when it has TLS. Clients
// hold no resources that need closing. It lives in this module's tests
// rather than in internal/testserver, which stays stdlib-only so that
// Consul's API client is in no other module's graph.
func agentClient(t testing.TB, agent *testserver.Consul, addr string) *api.Client {
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
