package raft

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// MinTTL is the TTL whose renewal window, at the default renew interval
// and drift margin, is one heartbeat timeout, rounded up to 10 ms.
func TestMinTTL(t *testing.T) {
	for _, tc := range []struct{ hb, want time.Duration }{
		{0, 2210 * time.Millisecond},
		{DefaultHeartbeatTimeout, 2210 * time.Millisecond},
		{500 * time.Millisecond, 890 * time.Millisecond},
		{200 * time.Millisecond, 360 * time.Millisecond},
		{50 * time.Millisecond, 90 * time.Millisecond},
	} {
		if got := MinTTL(tc.hb); got != tc.want {
			t.Errorf("MinTTL(%s) = %s, want %s", tc.hb, got, tc.want)
		}
		hb := tc.hb
		if hb == 0 {
			hb = DefaultHeartbeatTimeout
		}
		if err := CheckTiming(backend.Config{TTL: tc.want}, hb); err != nil {
			t.Errorf("CheckTiming(TTL %s, %s): %v", tc.want, hb, err)
		}
		if err := CheckTiming(backend.Config{TTL: tc.want - 10*time.Millisecond}, hb); err == nil {
			t.Errorf("CheckTiming(TTL %s, %s) = nil, want the floor", tc.want-10*time.Millisecond, hb)
		}
	}
}

// A TTL whose renewal window is below the group's heartbeat timeout is
// refused, with a *TTLError that is a *baton.ConfigError naming the floor:
// by New on a member (also when RenewInterval, not TTL, makes the window
// short), and by the raft leader when an agent client creates its session,
// so that the agent client's campaign fails at once (the Elector returns
// it) instead of holding terms that any stir of raft ends.
func TestTTLBelowFloorRefused(t *testing.T) {
	g := newTestGroup(t, 3) // heartbeat timeout 200 ms: floor 360 ms
	n := g.members()[0]
	floor := MinTTL(200 * time.Millisecond)
	for _, cfg := range []backend.Config{
		{TTL: 100 * time.Millisecond},
		{TTL: floor - 10*time.Millisecond},
		{TTL: time.Second, RenewInterval: 800 * time.Millisecond},
	} {
		_, err := New(n, Options{Config: cfg})
		checkTTLError(t, err, cfg.TTL, floor)
	}
	if _, err := New(n, Options{Config: backend.Config{TTL: floor}}); err != nil {
		t.Fatalf("New at the floor %s: %v", floor, err)
	}

	for _, via := range []*Node{g.leader(), followerOf(g)} {
		c, err := Dial(serveClients(t, via), ClientOptions{Token: testClientToken, PlainTCP: true})
		if err != nil {
			t.Fatal(err)
		}
		b := newBackend(t, c, backend.Config{TTL: 300 * time.Millisecond})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		_, err = b.Campaign(ctx, "short", baton.Candidate{ID: "c"})
		cancel()
		checkTTLError(t, err, 300*time.Millisecond, floor)

		e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "short-elector"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(t.Context(), 20*time.Second)
		err = e.Run(ctx, func(context.Context, baton.Term) error { return nil })
		cancel()
		checkTTLError(t, err, 300*time.Millisecond, floor)

		ok := newBackend(t, c, backend.Config{TTL: floor})
		ctx, cancel = context.WithTimeout(t.Context(), 20*time.Second)
		term, err := ok.Campaign(ctx, "at-floor", baton.Candidate{ID: "c"})
		cancel()
		if err != nil {
			t.Fatalf("agent client at the floor %s: %v", floor, err)
		}
		_ = term.Resign(t.Context())
	}
}

func followerOf(g *testGroup) *Node {
	l := g.leader()
	for _, n := range g.members() {
		if n != l {
			return n
		}
	}
	return nil
}

func checkTTLError(t *testing.T, err error, ttl, floor time.Duration) {
	t.Helper()
	var te *TTLError
	var ce *baton.ConfigError
	if !errors.As(err, &te) || !errors.As(err, &ce) {
		t.Fatalf("TTL %s: err %v (%T), want a *TTLError and a *baton.ConfigError", ttl, err, err)
	}
	if te.TTL != ttl || te.Min != floor || te.HeartbeatTimeout != 200*time.Millisecond {
		t.Errorf("TTLError %+v, want TTL %s, Min %s, HeartbeatTimeout 200ms", *te, ttl, floor)
	}
}
