package backendurl

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/hashicorp/consul/api"
)

// The window a consul:// URL answers before connecting is the one the
// Backend answers once made (baton.RenewalWindower), at the default TTL and
// at others.
func TestConsulWindowMatchesTheBackend(t *testing.T) {
	spec, err := Parse("consul://127.0.0.1:8500")
	if err != nil {
		t.Fatal(err)
	}
	client, err := api.NewClient(&api.Config{Address: "127.0.0.1:8500"}) // New does not connect
	if err != nil {
		t.Fatal(err)
	}
	for _, ttl := range []time.Duration{0, 2 * time.Second, 10 * time.Second, 61 * time.Second} {
		got, err := spec.RenewalWindow(ttl)
		if err != nil {
			t.Fatalf("TTL %s: %v", ttl, err)
		}
		b, err := consul.New(client, consul.Options{Config: backend.Config{TTL: ttl}})
		if err != nil {
			t.Fatal(err)
		}
		want := b.RenewalWindow()
		_ = b.Close(context.Background())
		if got != want || got <= 0 {
			t.Errorf("TTL %s: the URL's window is %s, the Backend's %s", ttl, got, want)
		}
	}
	if _, err := spec.RenewalWindow(-time.Second); err == nil {
		t.Error("TTL -1s: no error, want the one New gives")
	}
}
