package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
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
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// blindHolder campaigns for lease and stops the watcher of its key, waiting
// until the watcher has returned.
func blindHolder(t *testing.T, b *Backend, lease, id string) *stateTerm {
	t.Helper()
	term, err := b.Campaign(ctxFor(t, 10*time.Second), lease, baton.Candidate{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	st, ok := term.(*stateTerm)
	if !ok {
		t.Fatalf("Campaign returned a %T, want *stateTerm", term)
	}
	st.h.stop()
	// The watcher gives the lease name back as it returns.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if !b.sessions.Claimed(lease) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher of the holder's key did not stop")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return st
}

func rawState(t *testing.T, c *clientv3.Client, key string) string {
	t.Helper()
	resp, err := c.Get(ctxFor(t, 5*time.Second), key)
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
	raw := srv.Client(t)
	cfg := backend.Config{TTL: 30 * time.Second} // no session renewal during the test
	a := startBackend(t, srv.Client(t), cfg)
	b := startBackend(t, srv.Client(t), cfg)
	const lease = "fenced"

	ta := blindHolder(t, a, lease, "a")
	if err := ta.StoreState(ctxFor(t, 5*time.Second), []byte("from a")); err != nil {
		t.Fatal(err)
	}
	got := make(chan baton.Term, 1)
	bctx := ctxFor(t, 30*time.Second)
	go func() {
		tb, err := b.Campaign(bctx, lease, baton.Candidate{ID: "b"})
		if err != nil {
			t.Errorf("b's campaign: %v", err)
		}
		got <- tb
	}()
	if _, err := raw.Delete(ctxFor(t, 5*time.Second), ta.h.key); err != nil {
		t.Fatal(err)
	}
	var tb baton.StateTerm
	select {
	case term := <-got:
		if term == nil {
			t.FailNow()
		}
		tb = term.(baton.StateTerm)
	case <-time.After(20 * time.Second):
		t.Fatal("b did not take over after a's key was deleted")
	}
	if v, err := tb.LoadState(ctxFor(t, 5*time.Second)); err != nil || string(v) != "from a" {
		t.Fatalf("b's LoadState = %q, %v; want %q", v, err, "from a")
	}
	if err := tb.StoreState(ctxFor(t, 5*time.Second), []byte("from b")); err != nil {
		t.Fatal(err)
	}

	if err := ta.Err(); err != nil {
		t.Fatalf("a's term ended (%v) before its write: the test needs a holder unaware of its loss", err)
	}
	err := ta.StoreState(ctxFor(t, 5*time.Second), []byte("stale"))
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
	if err := tb.Resign(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestStoreStateAfterSessionRevoked: revoking the holder's session deletes
// its key on the server at once, while the holder hears of it only at its
// next renewal; its write must fail already.
func TestStoreStateAfterSessionRevoked(t *testing.T) {
	srv := testserver.StartEtcd(t)
	raw := srv.Client(t)
	a := startBackend(t, srv.Client(t), backend.Config{TTL: 30 * time.Second})
	const lease = "revoked"

	ta := blindHolder(t, a, lease, "a")
	if err := ta.StoreState(ctxFor(t, 5*time.Second), []byte("before")); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Revoke(ctxFor(t, 5*time.Second), ta.h.s.ID); err != nil {
		t.Fatal(err)
	}
	err := ta.StoreState(ctxFor(t, 5*time.Second), []byte("after"))
	if !errors.Is(err, baton.ErrLeaseLost) {
		t.Fatalf("StoreState after the session was revoked: %v, want ErrLeaseLost", err)
	}
	if v := rawState(t, raw, lease+stateSuffix); v != "before" {
		t.Errorf("state = %q, want %q unchanged", v, "before")
	}
	// The state outlived the session it was written under.
	resp, err := raw.Get(ctxFor(t, 5*time.Second), lease+stateSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease != 0 {
		t.Errorf("state key = %v, want one key attached to no etcd lease", resp.Kvs)
	}
}
