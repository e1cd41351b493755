package zookeeper_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// TestDigestAuthAndACL: with digest authentication and an ACL that gives
// the user everything and the world only reading, the Backend's nodes are
// safe from clients without the password, which can still see who leads.
func TestDigestAuthAndACL(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	acl := append(zk.DigestACL(zk.PermAll, "alice", "s3cret"), zk.WorldACL(zk.PermRead)...)
	opts := zookeeper.Options{Root: root, ACL: acl}
	a := dial(t, srv.Addr(), zookeeper.DialOptions{Options: opts, Digest: "alice:s3cret"})
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: opts, Digest: "alice:s3cret"})
	ta := testkit.CampaignWithin(t, a, "guarded", "alice-1", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "guarded", "alice-2")
	raw := rawConn(t, srv.Addr()) // not authenticated
	latch := root + "/guarded"
	testkit.Eventually(t, 5*time.Second, "b to queue", func() bool { return len(children(t, raw, latch)) == 2 })

	// ZooKeeper shows digests masked ("alice:x") to whoever lacks ADMIN.
	sameACL := func(a, b zk.ACL) bool {
		return a.Perms == b.Perms && a.Scheme == b.Scheme && strings.Split(a.ID, ":")[0] == strings.Split(b.ID, ":")[0]
	}
	for _, p := range []string{root, latch, latch + "/" + children(t, raw, latch)[0]} {
		got, _, err := raw.GetACL(p)
		if err != nil || !slices.EqualFunc(got, acl, sameACL) {
			t.Errorf("ACL of %s = %v, %v; want %v", p, got, err, acl)
		}
	}
	kids := children(t, raw, latch)
	for _, k := range kids {
		if err := raw.Delete(latch+"/"+k, -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("an unauthenticated client deleting %s: err = %v, want ErrNoAuth", k, err)
		}
	}
	if _, err := raw.Create(latch+"/latch-", []byte("intruder"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("an unauthenticated client joining the election: err = %v, want ErrNoAuth", err)
	}
	// Reading is open: a Backend without the password sees the leader,
	// and cannot campaign.
	c := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
	rec, err := c.Leader(testkit.Context(t, 5*time.Second), "guarded")
	if err != nil || rec.Holder != "alice-1" || rec.Token != ta.Token() {
		t.Errorf("Leader without the password = %+v, %v; want alice-1", rec, err)
	}
	wrong := dial(t, srv.Addr(), zookeeper.DialOptions{Options: opts, Digest: "alice:wrong"})
	if _, err := wrong.Campaign(testkit.Context(t, 5*time.Second), "guarded", baton.Candidate{ID: "mallory"}); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("campaign with the wrong password: err = %v, want ErrNoAuth", err)
	}
	if ta.Err() != nil {
		t.Fatalf("a's term ended: %v", ta.Err())
	}
	if err := ta.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitTerm(t, got, 5*time.Second)
}

// TestTLS runs an election over ZooKeeper's secureClientPort, and checks
// that the port really is TLS: a plain client gets no session there.
func TestTLS(t *testing.T) {
	t.Parallel()
	z := testserver.StartZooKeeper(t, testserver.ZooKeeperOptions{TLS: true})
	root := uniqueRoot(t)
	opts := zookeeper.DialOptions{Options: zookeeper.Options{Root: root}, TLS: z.ClientTLS()}
	a := dial(t, z.TLSAddr(), opts)
	b := dial(t, z.TLSAddr(), opts)
	ta := testkit.CampaignWithin(t, a, "secure", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "secure", "b")
	rec, err := b.Leader(testkit.Context(t, 5*time.Second), "secure")
	if err != nil || rec.Holder != "a" {
		t.Errorf("Leader over TLS = %+v, %v; want a", rec, err)
	}
	if err := ta.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if w := testkit.WaitTerm(t, got, 5*time.Second); w.Term.Token() <= ta.Token() {
		t.Errorf("b's token %d is not above a's %d", w.Term.Token(), ta.Token())
	}

	_, err = zookeeper.Dial(testkit.Context(t, 2*time.Second), []string{z.TLSAddr()}, zookeeper.DialOptions{})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("plain Dial to the TLS port: err = %v, want ErrBackendUnavailable", err)
	}
	anon := z.ClientTLS()
	anon.Certificates = nil
	_, err = zookeeper.Dial(testkit.Context(t, 2*time.Second), []string{z.TLSAddr()}, zookeeper.DialOptions{TLS: anon})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("TLS Dial without a client certificate: err = %v, want ErrBackendUnavailable", err)
	}
}
