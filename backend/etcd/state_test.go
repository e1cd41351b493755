package etcd_test

import (
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestStateOutlivesHolders: the state key is Prefix + NAME + "!state",
// attached to no session, so it survives every holder closing; it is not a
// candidate, so Leader reports none once they are gone.
func TestStateOutlivesHolders(t *testing.T) {
	srv := testserver.StartEtcd(t)
	raw := etcd.NewTestClient(t, srv.Endpoint())
	opts := etcd.Options{Prefix: "jobs/", Config: backend.Config{TTL: 2 * time.Second}}
	const lease = "nightly"

	a := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), opts)
	ta, ok := testkit.CampaignWithin(t, a, lease, "a", 10*time.Second).(baton.StateTerm)
	if !ok {
		t.Fatalf("%T is not a baton.StateTerm", ta)
	}
	if err := ta.StoreState(testkit.Context(t, 5*time.Second), []byte("slot 42")); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}

	resp, err := raw.Get(testkit.Context(t, 5*time.Second), "jobs/nightly!state")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "slot 42" || resp.Kvs[0].Lease != 0 {
		t.Fatalf("key jobs/nightly!state = %v, want %q attached to no etcd lease", resp.Kvs, "slot 42")
	}
	if ks := keys(t, raw, "jobs/"+lease); len(ks) != 0 {
		t.Errorf("election keys after Close: %q, want none", ks)
	}
	b := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), opts)
	if _, err := b.Leader(testkit.Context(t, 5*time.Second), lease); !errors.Is(err, baton.ErrNoLeader) {
		t.Errorf("Leader with the state key alone: %v, want ErrNoLeader", err)
	}
	// The closed holder's term may still read.
	if v, err := ta.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "slot 42" {
		t.Errorf("the closed term's LoadState = %q, %v; want %q", v, err, "slot 42")
	}
	if err := ta.StoreState(testkit.Context(t, 5*time.Second), []byte("closed")); !errors.Is(err, baton.ErrClosed) {
		t.Errorf("the closed term's StoreState: %v, want its end reason, ErrClosed", err)
	}

	tb, _ := testkit.CampaignWithin(t, b, lease, "b", 10*time.Second).(baton.StateTerm)
	if v, err := tb.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "slot 42" {
		t.Fatalf("the next holder's LoadState = %q, %v; want %q", v, err, "slot 42")
	}
	if err := tb.StoreState(testkit.Context(t, 5*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	if v, err := tb.LoadState(testkit.Context(t, 5*time.Second)); err != nil || v == nil || len(v) != 0 {
		t.Errorf("LoadState after storing an empty value = %#v, %v; want empty, not nil", v, err)
	}
	if err := tb.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}
