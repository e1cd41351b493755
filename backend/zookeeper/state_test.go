package zookeeper_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// rawState reads the state node with a client of its own, or nil if it
// does not exist.
func rawState(t *testing.T, raw *zk.Conn, path string) []byte {
	t.Helper()
	if _, err := raw.Sync(path); err != nil {
		t.Fatalf("sync %s: %v", path, err)
	}
	data, _, err := raw.Get(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatalf("get %s: %v", path, err)
	}
	return data
}

// TestStateLayout: the state node lies beside the latch paths, never under
// one, so that a Curator latch lists only the candidates' nodes; it is
// persistent, carries the configured ACL, and outlives the term.
func TestStateLayout(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t) + "/services"
	acl := zk.WorldACL(zk.PermRead | zk.PermWrite | zk.PermCreate | zk.PermDelete)
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root, ACL: acl}})
	raw := rawConn(t, srv.Addr())

	term := testkit.StateTerm(t, testkit.CampaignWithin(t, b, "billing", "host-1", 10*time.Second))
	latch := b.LatchPath("billing")
	before := children(t, raw, latch)
	if err := term.StoreState(testkit.Context(t, 10*time.Second), []byte("slot 42")); err != nil {
		t.Fatal(err)
	}
	if err := term.StoreState(testkit.Context(t, 10*time.Second), []byte("slot 43")); err != nil {
		t.Fatal(err)
	}
	state := b.StatePath("billing")
	if want := root + "/.baton-state/billing"; state != want {
		t.Errorf("StatePath = %q, want %q", state, want)
	}
	// What Curator's getParticipants would list: the latch's children,
	// which must still be the candidates' nodes and nothing else.
	after := children(t, raw, latch)
	if !slices.Equal(before, after) || len(after) != 1 || !latchNode.MatchString(after[0]) {
		t.Errorf("the latch's children were %q before StoreState and %q after; want the one latch node, unchanged", before, after)
	}
	kids := children(t, raw, root)
	slices.Sort(kids)
	if !slices.Equal(kids, []string{".baton-epoch", ".baton-state", "billing"}) {
		t.Errorf("children of %s = %q, want the latch path, .baton-epoch and .baton-state", root, kids)
	}
	if got := rawState(t, raw, state); string(got) != "slot 43" {
		t.Errorf("state node holds %q, want %q", got, "slot 43")
	}
	_, stat, err := raw.Get(state)
	if err != nil {
		t.Fatal(err)
	}
	if stat.EphemeralOwner != 0 {
		t.Errorf("state node is ephemeral (owner 0x%x); it must outlive the session", stat.EphemeralOwner)
	}
	for _, p := range []string{state, root + "/.baton-state"} {
		if got, _, err := raw.GetACL(p); err != nil || !slices.Equal(got, acl) {
			t.Errorf("ACL of %s = %v, %v; want Options.ACL %v", p, got, err, acl)
		}
	}

	// It outlives the term, and the latch container too.
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*testserver.ZooKeeperContainerCheck, "the empty latch container to go", func() bool {
		ok, _, err := raw.Exists(latch)
		return err == nil && !ok
	})
	next := testkit.StateTerm(t, testkit.CampaignWithin(t, b, "billing", "host-2", 10*time.Second))
	if v, err := next.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "slot 43" {
		t.Errorf("the next term's LoadState = %q, %v; want %q", v, err, "slot 43")
	}

	// An empty value is a stored state, unlike none.
	if err := next.StoreState(testkit.Context(t, 5*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	if v, err := next.LoadState(testkit.Context(t, 5*time.Second)); err != nil || v == nil || len(v) != 0 {
		t.Errorf("LoadState after storing nil = %#v, %v; want an empty, non-nil value", v, err)
	}
}

// TestStoreFencesDeletedHolder: a term whose latch node an operator
// deleted cannot store, whether or not its watch has told it yet: the
// multi's check fails in the store, the term ends with ErrLeaseLost, and
// the state is unchanged.
func TestStoreFencesDeletedHolder(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
	raw := rawConn(t, srv.Addr())
	state := b.StatePath("job")

	for _, bypass := range []bool{true, false} {
		term := testkit.StateTerm(t, testkit.CampaignWithin(t, b, "job", "a", 10*time.Second))
		if err := term.StoreState(testkit.Context(t, 5*time.Second), []byte("before")); err != nil {
			t.Fatal(err)
		}
		kids := children(t, raw, b.LatchPath("job"))
		if len(kids) != 1 {
			t.Fatalf("latch children %q, want one", kids)
		}
		if err := raw.Delete(b.LatchPath("job")+"/"+kids[0], -1); err != nil {
			t.Fatal(err)
		}
		var err error
		if bypass {
			// Skip StoreState's look at the term, which the watch may
			// have ended already: the store alone must refuse.
			err = zookeeper.StoreFenced(testkit.Context(t, 5*time.Second), term, []byte("after"))
		} else {
			err = term.StoreState(testkit.Context(t, 5*time.Second), []byte("after"))
		}
		if !errors.Is(err, baton.ErrLeaseLost) {
			t.Fatalf("StoreState (bypass %t) after the latch node was deleted: %v, want ErrLeaseLost", bypass, err)
		}
		if got := rawState(t, raw, state); string(got) != "before" {
			t.Fatalf("state = %q after the refused write, want %q", got, "before")
		}
		testkit.WaitDone(t, term, 5*time.Second)
		if !errors.Is(term.Err(), baton.ErrLeaseLost) {
			t.Errorf("term ended with %v, want ErrLeaseLost", term.Err())
		}
		if v, err := term.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "before" {
			t.Errorf("the lost term's LoadState = %q, %v; want %q", v, err, "before")
		}
	}
}

// TestStoreFencesExpiredSession: a holder whose session the server expired
// (its node went with it) cannot store, even through a client that has
// since made a new session.
func TestStoreFencesExpiredSession(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	cfg := backend.Config{TTL: testserver.ZooKeeperMinSessionTimeout}
	proxy := testserver.StartProxy(t, srv.Addr())
	conn, probe := connect(t, proxy.Addr(), cfg)
	a := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
	c := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: root}})
	raw := rawConn(t, srv.Addr())

	ta := testkit.StateTerm(t, testkit.CampaignWithin(t, a, "job", "a", 10*time.Second))
	if err := ta.StoreState(testkit.Context(t, 5*time.Second), []byte("from a")); err != nil {
		t.Fatal(err)
	}
	old := conn.SessionID()
	got := testkit.CampaignAsync(t, c, "job", "c")
	proxy.Cut()
	tc := testkit.StateTerm(t, testkit.WaitTerm(t, got, 60*time.Second).Term)
	if err := tc.StoreState(testkit.Context(t, 5*time.Second), []byte("from c")); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
	// Once a's client is back, with a new session, its write goes out (a
	// request the client could not send is dropped once the term ended)
	// and must not land.
	testkit.Eventually(t, 30*time.Second, "a's client to have a new session", func() bool {
		return conn.State() == zk.StateHasSession && conn.SessionID() != old
	})
	err := zookeeper.StoreFenced(testkit.Context(t, 30*time.Second), ta, []byte("stale"))
	if !errors.Is(err, baton.ErrLeaseLost) {
		t.Errorf("a's store after its session expired: %v, want ErrLeaseLost", err)
	}
	if v := rawState(t, raw, c.StatePath("job")); string(v) != "from c" {
		t.Errorf("state = %q, want the successor's %q", v, "from c")
	}
}

func TestStateNameReserved(t *testing.T) {
	if err := zookeeper.CheckName(".baton-state"); err == nil {
		t.Errorf("CheckName(.baton-state) = nil: the name would be the latch path of the state tree")
	}
	for _, root := range []string{"/.baton-state", "/x/.baton-state", "/x/.baton-state/y"} {
		if err := (zookeeper.Options{Root: root}).Validate(); err == nil {
			t.Errorf("Root %q accepted: its latch paths would lie in another Root's state tree", root)
		}
	}
	b := dial(t, testserver.SharedZooKeeper(t).Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: "/"}})
	if got := b.StatePath("x"); got != "/.baton-state/x" {
		t.Errorf("StatePath with Root / = %q", got)
	}
	if _, err := b.Campaign(context.Background(), ".baton-state", baton.Candidate{ID: "x"}); err == nil {
		t.Errorf("Campaign for .baton-state succeeded")
	}
}
