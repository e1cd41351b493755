package testserver_test

import (
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// The agent must grant the sub-second session TTLs the Consul backend's
// tests rely on: Consul's default session_ttl_min is 10 s, and -dev mode
// does not lower it by itself.
func TestConsulShortSessionTTL(t *testing.T) {
	c := testserver.StartConsul(t, testserver.ConsulOptions{})
	client := c.Client(t, c.Addr())

	ttl := (5 * testserver.ConsulSessionTTLMin).String()
	id, _, err := client.Session().CreateNoChecks(&api.SessionEntry{TTL: ttl}, nil)
	if err != nil {
		t.Fatalf("create a session with TTL %s: %v", ttl, err)
	}
	info, _, err := client.Session().Info(id, nil)
	if err != nil || info == nil {
		t.Fatalf("session info: %v, %v", info, err)
	}
	if info.TTL != ttl {
		t.Errorf("session TTL = %q, want %q", info.TTL, ttl)
	}
	if _, _, err := client.Session().CreateNoChecks(&api.SessionEntry{TTL: (testserver.ConsulSessionTTLMin / 2).String()}, nil); err == nil {
		t.Errorf("a session TTL below session_ttl_min was accepted: is the agent using its own minimum?")
	}
	// Consul invalidates an unrenewed session (at twice its TTL); waiting for
	// that is how the tests see a killed holder replaced.
	eventually(t, 10*time.Second, func() error {
		info, _, err := client.Session().Info(id, nil)
		if err != nil {
			return err
		}
		if info != nil {
			return errors.New("session still alive")
		}
		return nil
	})
}

func TestConsulACL(t *testing.T) {
	c := testserver.StartConsul(t, testserver.ConsulOptions{ACL: true})
	if c.ManagementToken() == "" {
		t.Fatal("no management token")
	}
	anon, err := api.NewClient(&api.Config{Address: c.Addr(), Token: "anonymous"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil); err == nil {
		t.Error("a write without a token succeeded under default_policy deny")
	}
	if _, err := c.Client(t, c.Addr()).KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil); err != nil {
		t.Errorf("a write with the management token: %v", err)
	}
}

func TestConsulTLS(t *testing.T) {
	c := testserver.StartConsul(t, testserver.ConsulOptions{TLS: true})
	if _, _, err := c.Client(t, c.Addr()).KV().Get("k", nil); err != nil {
		t.Errorf("get over HTTPS with the client certificate: %v", err)
	}
	ca, _, _ := c.TLSFiles()
	noCert, err := api.NewClient(&api.Config{Address: c.Addr(), Scheme: "https", TLSConfig: api.TLSConfig{CAFile: ca}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := noCert.KV().Get("k", nil); err == nil {
		t.Error("a client without a certificate was served, though the agent requires one")
	}
}
