package testserver_test

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestZooKeeperEnsemble: the servers form one quorum on loopback, elect a
// new leader when theirs is killed, and take a restarted server back.
func TestZooKeeperEnsemble(t *testing.T) {
	start := time.Now()
	e := testserver.StartZooKeeperEnsemble(t, 3)
	t.Logf("ensemble of 3 ready in %s", time.Since(start).Round(time.Millisecond))
	addrs := e.Addrs()
	if len(addrs) != 3 || e.Len() != 3 {
		t.Fatalf("Addrs() = %q, Len() = %d; want 3 servers", addrs, e.Len())
	}
	for i, a := range addrs {
		if host, _, err := net.SplitHostPort(a); err != nil || host != "127.0.0.1" {
			t.Errorf("server %d's address is %q, want 127.0.0.1:PORT", i, a)
		}
		if slices.Index(addrs, a) != i || e.Index(a) != i {
			t.Errorf("address %q is not server %d's alone", a, i)
		}
	}
	leader := e.LeaderIndex()
	if leader < 0 {
		t.Fatal("no server says it leads")
	}
	for i := range addrs {
		if want := map[bool]string{true: "leader", false: "follower"}[i == leader]; e.Mode(i) != want {
			t.Errorf("server %d's mode is %q, want %s", i, e.Mode(i), want)
		}
	}

	e.Kill(leader)
	killedAt := time.Now()
	if e.Running(leader) || e.Mode(leader) != "" {
		t.Errorf("server %d still runs after Kill", leader)
	}
	// Poll for the other two's election; 30 s is ample even on a loaded
	// machine (it takes well under a second on an idle one).
	next := -1
	testkit.Eventually(t, 30*time.Second, "the two servers left to elect a leader", func() bool {
		next = e.LeaderIndex()
		return next >= 0
	})
	if next == leader {
		t.Fatalf("the killed server %d still leads", leader)
	}
	t.Logf("server %d took over from %d within %s of the kill", next, leader, time.Since(killedAt).Round(time.Millisecond))

	if err := e.Restart(leader); err != nil {
		t.Fatal(err)
	}
	if mode := e.Mode(leader); mode != "follower" {
		t.Errorf("the restarted server %d is %q, want follower of %d", leader, mode, next)
	}
	if err := e.Restart(leader); err == nil {
		t.Errorf("Restart of a running server succeeded")
	}
	e.Close()
	e.Close()
	for i := range addrs {
		if e.Running(i) {
			t.Errorf("server %d runs after Close", i)
		}
	}
	if err := e.Restart(0); err == nil {
		t.Errorf("Restart after Close succeeded")
	}
}
