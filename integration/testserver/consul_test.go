package testserver_test

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/integration/internal/clients"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// The agent must grant the sub-second session TTLs the Consul backend's
// tests rely on: Consul's default session_ttl_min is 10 s, and -dev mode
// does not lower it by itself.
func TestConsulShortSessionTTL(t *testing.T) {
	c := testserver.StartConsul(t, testserver.ConsulOptions{})
	client := clients.Consul(t, c, c.Addr())

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
	testkit.EventuallyErr(t, 10*time.Second, "the unrenewed session invalidated", func() error {
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
	if _, err := clients.Consul(t, c, c.Addr()).KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil); err != nil {
		t.Errorf("a write with the management token: %v", err)
	}
}

func TestConsulTLS(t *testing.T) {
	c := testserver.StartConsul(t, testserver.ConsulOptions{TLS: true})
	if _, _, err := clients.Consul(t, c, c.Addr()).KV().Get("k", nil); err != nil {
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

// newConsul starts an agent in dir, going through Unavailable when the
// binary cannot be had; the caller stops it.
func newConsul(t *testing.T, dir string, opts testserver.ConsulOptions) *testserver.Consul {
	t.Helper()
	c, err := testserver.NewConsul(dir, opts)
	var te *testserver.ToolError
	if errors.As(err, &te) {
		testserver.Unavailable(t, "consul", te)
	}
	if err != nil {
		t.Fatalf("start consul: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consul log:\n%s", c.Log())
		}
	})
	t.Cleanup(c.Close)
	return c
}

// persistedWrites writes a key, creates a session and locks a second key
// with it, and returns the session's id.
func persistedWrites(t *testing.T, client *api.Client) string {
	t.Helper()
	if _, err := client.KV().Put(&api.KVPair{Key: "persist/k", Value: []byte("v")}, nil); err != nil {
		t.Fatalf("put: %v", err)
	}
	id, _, err := client.Session().CreateNoChecks(&api.SessionEntry{TTL: "60s", Behavior: api.SessionBehaviorDelete}, nil)
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	ok, _, err := client.KV().Acquire(&api.KVPair{Key: "persist/lock", Value: []byte("holder"), Session: id}, nil)
	if err != nil || !ok {
		t.Fatalf("acquire with the session: %v, %v", ok, err)
	}
	return id
}

// checkPersisted checks that what persistedWrites wrote is all there.
func checkPersisted(t *testing.T, client *api.Client, id string) {
	t.Helper()
	kv, _, err := client.KV().Get("persist/k", nil)
	if err != nil || kv == nil || string(kv.Value) != "v" {
		t.Errorf("key after restart: %v, %v; want v", kv, err)
	}
	info, _, err := client.Session().Info(id, nil)
	if err != nil || info == nil {
		t.Errorf("session %s after restart: %v, %v; want it alive", id, info, err)
	}
	lock, _, err := client.KV().Get("persist/lock", nil)
	if err != nil || lock == nil || lock.Session != id {
		t.Errorf("lock after restart: %+v, %v; want held by session %s", lock, err, id)
	}
}

// A Persist server brings its KV store and sessions back after a clean
// restart on the same dir, on the same address, with the same ACL token and
// TLS certificates: a client made before the restart keeps working.
func TestConsulPersistRestart(t *testing.T) {
	dir := t.TempDir()
	opts := testserver.ConsulOptions{Persist: true, ACL: true, TLS: true}
	c := newConsul(t, dir, opts)
	addr, token := c.Addr(), c.ManagementToken()
	client := clients.Consul(t, c, c.Addr())
	id := persistedWrites(t, client)
	c.Close()

	c = newConsul(t, dir, opts)
	if c.Addr() != addr || c.ManagementToken() != token {
		t.Errorf("restart at %s with token %q, want %s and %q", c.Addr(), c.ManagementToken(), addr, token)
	}
	checkPersisted(t, client, id)
}

// Acknowledged writes survive SIGKILL of a Persist server; a restart whose
// ports are taken fails with an error naming the port, and works once the
// port is free again.
func TestConsulPersistSurvivesKill(t *testing.T) {
	dir := t.TempDir()
	opts := testserver.ConsulOptions{Persist: true}
	c := newConsul(t, dir, opts)
	id := persistedWrites(t, clients.Consul(t, c, c.Addr()))
	c.Kill()

	ln, err := net.Listen("tcp", c.Addr())
	if err != nil {
		t.Fatalf("hold the killed server's port: %v", err)
	}
	_, err = testserver.NewConsul(dir, opts)
	ln.Close()
	if err == nil || !strings.Contains(err.Error(), "http port "+c.Addr()+" is taken") {
		t.Fatalf("restart with its HTTP port taken: %v, want an error naming the port", err)
	}

	c = newConsul(t, dir, opts)
	checkPersisted(t, clients.Consul(t, c, c.Addr()), id)
}

// Without Persist, an agent on the same dir starts empty: -dev keeps its
// data in memory.
func TestConsulDevForgets(t *testing.T) {
	dir := t.TempDir()
	c := newConsul(t, dir, testserver.ConsulOptions{})
	if _, err := clients.Consul(t, c, c.Addr()).KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	c = newConsul(t, dir, testserver.ConsulOptions{})
	if kv, _, err := clients.Consul(t, c, c.Addr()).KV().Get("k", nil); err != nil || kv != nil {
		t.Errorf("a -dev agent restarted on the same dir has %v, %v; want nothing", kv, err)
	}
}
