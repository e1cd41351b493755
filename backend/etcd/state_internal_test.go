package etcd

import (
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// These tests reach inside the Backend for one thing: to stop the watcher
// of the holder's key, so that the holder goes on believing in its term
// after the key is gone, as a process does whose watch event is late or
// which was paused. What must stop its write is etcd's own answer.

func startBackend(t *testing.T, client *clientv3.Client, cfg backend.Config) *Backend {
	t.Helper()
	b, err := New(client, Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return testkit.CloseAtEnd(t, b, 5*time.Second)
}

// blindHolder campaigns for lease and stops the watcher of its key, waiting
// until the watcher has returned.
func blindHolder(t *testing.T, b *Backend, lease, id string) *stateTerm {
	t.Helper()
	term := testkit.CampaignWithin(t, b, lease, id, 10*time.Second)
	st, ok := term.(*stateTerm)
	if !ok {
		t.Fatalf("Campaign returned a %T, want *stateTerm", term)
	}
	st.h.stop(b)
	// The watcher gives the lease name back as it returns.
	testkit.Eventually(t, 10*time.Second, "the watcher of the holder's key to stop", func() bool {
		return !b.sessions.Claimed(lease)
	})
	return st
}

func rawState(t *testing.T, c *clientv3.Client, key string) string {
	t.Helper()
	resp, err := c.Get(testkit.Context(t, 5*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("no key %s", key)
	}
	return string(resp.Kvs[0].Value)
}

// TestStoreStateFencedByEtcd: the holder's key is deleted behind its back,
// the next candidate takes over and stores its state; the old holder, still
// sure of its term, cannot overwrite it.
func TestStoreStateFencedByEtcd(t *testing.T) {
	srv := testserver.StartEtcd(t)
	raw := testClient(t, srv.Endpoint())
	cfg := backend.Config{TTL: 30 * time.Second} // no session renewal during the test
	a := startBackend(t, testClient(t, srv.Endpoint()), cfg)
	b := startBackend(t, testClient(t, srv.Endpoint()), cfg)
	const lease = "fenced"

	ta := blindHolder(t, a, lease, "a")
	if err := ta.StoreState(testkit.Context(t, 5*time.Second), []byte("from a")); err != nil {
		t.Fatal(err)
	}
	got := testkit.CampaignAsync(t, b, lease, "b")
	if _, err := raw.Delete(testkit.Context(t, 5*time.Second), ta.h.key); err != nil {
		t.Fatal(err)
	}
	// b takes over once a's key is deleted.
	tb := testkit.WaitTerm(t, got, 20*time.Second).Term.(baton.StateTerm)
	if v, err := tb.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "from a" {
		t.Fatalf("b's LoadState = %q, %v; want %q", v, err, "from a")
	}
	if err := tb.StoreState(testkit.Context(t, 5*time.Second), []byte("from b")); err != nil {
		t.Fatal(err)
	}

	if err := ta.Err(); err != nil {
		t.Fatalf("a's term ended (%v) before its write: the test needs a holder unaware of its loss", err)
	}
	err := ta.StoreState(testkit.Context(t, 5*time.Second), []byte("stale"))
	if !errors.Is(err, baton.ErrLeaseLost) {
		t.Fatalf("the deposed holder's StoreState: %v, want ErrLeaseLost", err)
	}
	if !errors.Is(ta.Err(), baton.ErrLeaseLost) {
		t.Errorf("after etcd refused its write, a's Err() = %v, want ErrLeaseLost", ta.Err())
	}
	select {
	case <-ta.Done():
	default:
		t.Errorf("a's term did not end when etcd refused its write")
	}
	if v := rawState(t, raw, lease+stateSuffix); v != "from b" {
		t.Errorf("state after the deposed holder's write = %q, want %q", v, "from b")
	}
	if err := tb.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestStoreStateAfterSessionRevoked: revoking the holder's session deletes
// its key on the server at once, while the holder hears of it only at its
// next renewal; its write must fail already.
func TestStoreStateAfterSessionRevoked(t *testing.T) {
	srv := testserver.StartEtcd(t)
	raw := testClient(t, srv.Endpoint())
	a := startBackend(t, testClient(t, srv.Endpoint()), backend.Config{TTL: 30 * time.Second})
	const lease = "revoked"

	ta := blindHolder(t, a, lease, "a")
	if err := ta.StoreState(testkit.Context(t, 5*time.Second), []byte("before")); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Revoke(testkit.Context(t, 5*time.Second), ta.h.s.ID); err != nil {
		t.Fatal(err)
	}
	err := ta.StoreState(testkit.Context(t, 5*time.Second), []byte("after"))
	if !errors.Is(err, baton.ErrLeaseLost) {
		t.Fatalf("StoreState after the session was revoked: %v, want ErrLeaseLost", err)
	}
	if v := rawState(t, raw, lease+stateSuffix); v != "before" {
		t.Errorf("state = %q, want %q unchanged", v, "before")
	}
	// The state outlived the session it was written under.
	resp, err := raw.Get(testkit.Context(t, 5*time.Second), lease+stateSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease != 0 {
		t.Errorf("state key = %v, want one key attached to no etcd lease", resp.Kvs)
	}
}
