package etcd

import (
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestServerRefusesTTL: New refuses a TTL above MaxTTL, etcd's own limit,
// and accepts MaxTTL, which the real server grants. A server that refuses a
// lease TTL anyway (here: MaxTTL plus a second, past New's check, as a
// server with a lower limit would) fails the campaign with a *TTLError, a
// *baton.ConfigError, at once: the Elector stops on it instead of retrying
// it as an outage.
func TestServerRefusesTTL(t *testing.T) {
	client := testClient(t, testserver.StartEtcd(t).Endpoint())
	var ce *baton.ConfigError
	if _, err := New(client, Options{Config: backend.Config{TTL: MaxTTL + time.Nanosecond}}); !errors.As(err, &ce) {
		t.Errorf("New with TTL MaxTTL+1ns: %v, want a ConfigError", err)
	}
	b := startBackend(t, client, backend.Config{TTL: MaxTTL})
	term := testkit.CampaignWithin(t, b, "max", "a", 10*time.Second)
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}

	b = startBackend(t, client, backend.Config{TTL: 10 * time.Second})
	b.ttlSec = int64(MaxTTL/time.Second) + 1
	_, err := b.Campaign(testkit.Context(t, 10*time.Second), "above", baton.Candidate{ID: "a"})
	var te *TTLError
	if !errors.As(err, &te) || !errors.As(err, &ce) {
		t.Fatalf("Campaign with a lease TTL the server refuses: %v, want a TTLError that is a ConfigError", err)
	}
	if te.TTL != MaxTTL+time.Second {
		t.Errorf("TTLError.TTL = %s, want %s", te.TTL, MaxTTL+time.Second)
	}
}
