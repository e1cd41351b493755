package zookeeper_test

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

var latchNode = regexp.MustCompile(`^_c_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}-latch-[0-9]{10}$`)

// TestCuratorLayout checks the node a campaign leaves, field by field
// against what Curator's LeaderLatch makes and reads.
func TestCuratorLayout(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t) + "/services"
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
	raw := rawConn(t, srv.Addr())

	term := testkit.CampaignWithin(t, b, "billing", "host-1/4f2a", 10*time.Second)
	latch := root + "/billing"
	if got := b.LatchPath("billing"); got != latch {
		t.Errorf("LatchPath = %q, want %q", got, latch)
	}
	kids := children(t, raw, latch)
	if len(kids) != 1 || !latchNode.MatchString(kids[0]) {
		t.Fatalf("children of %s = %q, want one _c_<UUID>-latch-<sequence> node", latch, kids)
	}
	data, stat, err := raw.Get(latch + "/" + kids[0])
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != "host-1/4f2a" {
		t.Errorf("node data %q, want the candidate ID", data)
	}
	if tokenOf(t, raw, b, stat.Czxid) != term.Token() {
		t.Errorf("token %d, want the epoch<<32 + the node's czxid %d", term.Token(), stat.Czxid)
	}
	if stat.EphemeralOwner != b.Conn().SessionID() {
		t.Errorf("node owned by session 0x%x, want the Backend's 0x%x (ephemeral)", stat.EphemeralOwner, b.Conn().SessionID())
	}
	acl, _, err := raw.GetACL(latch + "/" + kids[0])
	if err != nil || !slices.Equal(acl, zk.WorldACL(zk.PermAll)) {
		t.Errorf("node ACL = %v, %v; want the open default", acl, err)
	}
	rec, err := b.Leader(testkit.Context(t, 5*time.Second), "billing")
	if err != nil || rec.Holder != "host-1/4f2a" || rec.Token != term.Token() || !rec.Since.IsZero() {
		t.Errorf("Leader = %+v, %v; want host-1/4f2a with token %d and no Since", rec, err, term.Token())
	}
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if kids := children(t, raw, latch); len(kids) != 0 {
		t.Errorf("after Resign the latch still has %q", kids)
	}
	// Missing parents were made as containers, as Curator's
	// creatingParentContainersIfNeeded makes them (a client cannot tell
	// from a node's stat): the server deletes them once empty.
	testkit.Eventually(t, 10*testserver.ZooKeeperContainerCheck, "the empty latch container to go", func() bool {
		ok, _, err := raw.Exists(latch)
		return err == nil && !ok
	})
	// And a campaign makes them again.
	again := testkit.CampaignWithin(t, b, "billing", "host-1/4f2a", 10*time.Second)
	if again.Token() <= term.Token() {
		t.Errorf("token %d after the latch was remade is not above %d", again.Token(), term.Token())
	}
}

// TestSortsLikeCurator mixes nodes made the way Curator makes them
// (protected, and the older unprotected "latch-" form) with a Backend's:
// the lowest sequence number leads, whatever the prefix.
func TestSortsLikeCurator(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
	raw := rawConn(t, srv.Addr())
	latch := root + "/mixed"
	mkdirs(t, raw, latch)
	// An unprotected node (sequence 0) and a protected one whose UUID
	// sorts after ours would (sequence 1), both ahead of the Backend.
	plain, err := raw.Create(latch+"/latch-", []byte("jvm-plain"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	prot, err := raw.Create(latch+"/_c_ffffffff-ffff-4fff-bfff-ffffffffffff-latch-", []byte("jvm-protected"),
		zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 10*time.Second)
	if rec, err := b.Leader(ctx, "mixed"); err != nil || rec.Holder != "jvm-plain" {
		t.Fatalf("Leader = %+v, %v; want jvm-plain, the lowest sequence", rec, err)
	}
	got := testkit.CampaignAsync(t, b, "mixed", "go")
	testkit.Eventually(t, 5*time.Second, "the Backend's node", func() bool { return len(children(t, raw, latch)) == 3 })
	if err := raw.Delete(plain, -1); err != nil {
		t.Fatal(err)
	}
	if rec, err := b.Leader(ctx, "mixed"); err != nil || rec.Holder != "jvm-protected" {
		t.Fatalf("Leader = %+v, %v; want jvm-protected", rec, err)
	}
	select {
	case w := <-got:
		t.Fatalf("the Backend won (token %v) behind jvm-protected", w.Term)
	case <-time.After(200 * time.Millisecond):
	}
	if err := raw.Delete(prot, -1); err != nil {
		t.Fatal(err)
	}
	w := testkit.WaitTerm(t, got, 5*time.Second)
	if rec, err := b.Leader(ctx, "mixed"); err != nil || rec.Holder != "go" || rec.Token != w.Term.Token() {
		t.Errorf("Leader = %+v, %v; want go", rec, err)
	}
}

// TestWaitersWatchOnlyTheirPredecessor: a departure must wake one waiter,
// not all of them (no herd). The server's watch table shows who watches
// what.
func TestWaitersWatchOnlyTheirPredecessor(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	raw := rawConn(t, srv.Addr())
	latch := root + "/herd"
	var bs []*zookeeper.Backend
	var terms []<-chan testkit.Won
	for i, id := range []string{"a", "b", "c", "d"} {
		b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
		bs = append(bs, b)
		terms = append(terms, testkit.CampaignAsync(t, b, "herd", id))
		testkit.Eventually(t, 5*time.Second, id+"'s node", func() bool { return len(children(t, raw, latch)) == i+1 })
	}
	kids := children(t, raw, latch)
	slices.SortFunc(kids, func(x, y string) int { return strings.Compare(x[len(x)-10:], y[len(y)-10:]) })
	want := map[string][]int64{ // node -> sessions watching it
		kids[0]: {bs[0].Conn().SessionID(), bs[1].Conn().SessionID()}, // the holder watches its own
		kids[1]: {bs[2].Conn().SessionID()},
		kids[2]: {bs[3].Conn().SessionID()},
	}
	testkit.Eventually(t, 5*time.Second, "one watcher per predecessor", func() bool {
		got := watchers(t, srv)
		for i, k := range kids {
			w := got[latch+"/"+k]
			slices.Sort(w)
			ww := slices.Clone(want[kids[i]])
			slices.Sort(ww)
			if !slices.Equal(w, ww) {
				return false
			}
		}
		_, latchWatched := got[latch]
		return !latchWatched
	})
	w := testkit.WaitTerm(t, terms[0], 5*time.Second)
	if err := w.Term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitTerm(t, terms[1], 5*time.Second)
	for _, ch := range terms[2:] {
		select {
		case w := <-ch:
			t.Errorf("a waiter further back won token %d", w.Term.Token())
		default:
		}
	}
}

// watchers parses the server's wchp answer: each watched path, followed by
// the watching sessions' IDs on indented lines.
func watchers(t *testing.T, srv *testserver.ZooKeeper) map[string][]int64 {
	t.Helper()
	out, err := srv.FourLetter("wchp")
	if err != nil {
		t.Fatalf("wchp: %v", err)
	}
	got := map[string][]int64{}
	var path string
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "/"):
			path = strings.TrimSpace(line)
			got[path] = nil
		case strings.TrimSpace(line) != "" && path != "":
			id, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(line), "0x"), 16, 64)
			if err != nil {
				t.Fatalf("wchp line %q: %v", line, err)
			}
			got[path] = append(got[path], int64(id))
		}
	}
	return got
}

// TestReconnectWithinSafeUntilKeepsTerm: a partition shorter than what is
// left of the term, during which renewals fail, must not end the term: the
// client reconnects to the same session, its node is still there, and
// renewals carry on. Nobody else takes over meanwhile.
func TestReconnectWithinSafeUntilKeepsTerm(t *testing.T) {
	// Waits out timeouts rather than working: runs beside the others.
	t.Parallel()
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	// A reconnection after the partition takes the client about a second
	// (it pauses between rounds of its server list): leave it room.
	cfg := backend.Config{TTL: 8 * time.Second}
	proxy := testserver.StartProxy(t, srv.Addr())
	conn, probe := connect(t, proxy.Addr(), cfg)
	logs := newLogRecorder()
	a := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe, Logger: logs.logger()})
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: root}})
	raw := rawConn(t, srv.Addr())
	latch := root + "/steady"

	ta := testkit.CampaignWithin(t, a, "steady", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "steady", "b")
	testkit.Eventually(t, 5*time.Second, "b to queue", func() bool { return len(children(t, raw, latch)) == 2 })
	session := conn.SessionID()

	proxy.Cut()
	cutAt := time.Now()
	before := ta.SafeUntil()
	// Heal once the Backend has seen a renewal fail: the term must then
	// live on the strength of safe-until alone.
	logs.await(t, "session renewal failed; retrying", cfg.TTL)
	if !time.Now().Before(before) {
		t.Fatalf("the partition outlasted safe-until; the test needs a longer TTL")
	}
	proxy.Heal()
	t.Logf("cut for %s; %s of the term was left", time.Since(cutAt).Round(time.Millisecond), time.Until(before).Round(time.Millisecond))
	testkit.Eventually(t, cfg.TTL, "a renewal after the partition healed", func() bool { return ta.SafeUntil().After(before) })
	if err := ta.Err(); err != nil {
		t.Fatalf("the term ended across a short partition: %v", err)
	}
	if got := conn.SessionID(); got != session {
		t.Errorf("session 0x%x after reconnecting, want the same 0x%x", got, session)
	}
	rec, err := b.Leader(testkit.Context(t, 5*time.Second), "steady")
	if err != nil || rec.Holder != "a" || rec.Token != ta.Token() {
		t.Errorf("Leader = %+v, %v; want a, token %d", rec, err, ta.Token())
	}
	select {
	case w := <-got:
		t.Fatalf("b won token %d while a's term lasted", w.Term.Token())
	default:
	}
	// Renewals carry on, not just one.
	next := ta.SafeUntil()
	testkit.Eventually(t, cfg.TTL, "another renewal", func() bool { return ta.SafeUntil().After(next) })
	if err := ta.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if w := testkit.WaitTerm(t, got, 5*time.Second); w.Term.Token() <= ta.Token() {
		t.Errorf("b's token %d is not above a's %d", w.Term.Token(), ta.Token())
	}
}

// TestLongPartitionEndsTermBeforeSessionExpiry: cut off for good, a holder
// stops at its safe-until, with ErrExpired, while the server still holds
// its session and node; the standby takes over only once the server
// expired the session. After healing, the old holder's client finds its
// session expired and the Backend campaigns on a new one.
func TestLongPartitionEndsTermBeforeSessionExpiry(t *testing.T) {
	// Waits out timeouts rather than working: runs beside the others.
	t.Parallel()
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	cfg := backend.Config{TTL: 3 * time.Second, DriftMargin: 500 * time.Millisecond}
	proxy := testserver.StartProxy(t, srv.Addr())
	conn, probe := connect(t, proxy.Addr(), cfg)
	a := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: root}})
	raw := rawConn(t, srv.Addr())
	latch := root + "/cut"

	ta := testkit.CampaignWithin(t, a, "cut", "a", 10*time.Second)
	nodeA := latch + "/" + children(t, raw, latch)[0]
	got := testkit.CampaignAsync(t, b, "cut", "b")
	testkit.Eventually(t, 5*time.Second, "b to queue", func() bool { return len(children(t, raw, latch)) == 2 })
	session := conn.SessionID()

	proxy.Cut()
	endedAt := testkit.WaitDone(t, ta, cfg.TTL+5*time.Second)
	// Ask the server at once whether a's node is still there: the term
	// must have ended while the session was still alive.
	ok, _, err := raw.Exists(nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Errorf("a's node was gone right after its term ended at safe-until: the server expired the session first")
	}
	if !errors.Is(ta.Err(), baton.ErrExpired) {
		t.Errorf("a's term ended with %v, want ErrExpired", ta.Err())
	}
	if late := endedAt.Sub(ta.SafeUntil()); late > 100*time.Millisecond {
		t.Errorf("a's term ended %s after its safe-until", late)
	}
	w := testkit.WaitTerm(t, got, cfg.TTL+5*time.Second)
	if !w.At.After(endedAt) {
		t.Errorf("b won at %v, before a stopped at %v", w.At, endedAt)
	}
	if ok, _, _ := raw.Exists(nodeA); ok {
		t.Errorf("b won while a's node was still there")
	}
	if w.Term.Token() <= ta.Token() {
		t.Errorf("b's token %d is not above a's %d", w.Term.Token(), ta.Token())
	}

	proxy.Heal()
	testkit.Eventually(t, 15*time.Second, "a's client to get a new session", func() bool {
		sid := conn.SessionID()
		return sid != 0 && sid != session
	})
	again := testkit.CampaignAsync(t, a, "cut", "a")
	if err := w.Term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ta2 := testkit.WaitTerm(t, again, 10*time.Second)
	if ta2.Term.Token() <= w.Term.Token() {
		t.Errorf("a's new token %d is not above b's %d", ta2.Term.Token(), w.Term.Token())
	}
}

// TestExpiredTermGivesUpNodeOnReconnect: a holder cut off past its
// safe-until stops, but its session can outlive the partition (the server
// expires it a full timeout after it last heard from the client, and
// safe-until is DriftMargin earlier than that). Reconnected to the same
// session, the Backend must delete the stopped term's node rather than let
// it keep the lease from everyone until the session ends, which for a live
// process is never.
func TestExpiredTermGivesUpNodeOnReconnect(t *testing.T) {
	// Waits out timeouts rather than working: runs beside the others.
	t.Parallel()
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	// A wide margin between safe-until and the session's expiry, so that
	// the client reconnects in between.
	// Safe-until is the ensemble lag (a quarter of the timeout plus
	// RenewInterval) and DriftMargin before the expiry: 6.5 s here.
	cfg := backend.Config{TTL: 10 * time.Second, DriftMargin: 3 * time.Second, RenewInterval: time.Second}
	proxy := testserver.StartProxy(t, srv.Addr())
	conn, probe := connect(t, proxy.Addr(), cfg)
	a := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: root}})
	raw := rawConn(t, srv.Addr())
	latch := root + "/revived"

	ta := testkit.CampaignWithin(t, a, "revived", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "revived", "b")
	testkit.Eventually(t, 5*time.Second, "b to queue", func() bool { return len(children(t, raw, latch)) == 2 })
	session := conn.SessionID()

	proxy.Cut()
	cutAt := time.Now()
	testkit.WaitDone(t, ta, cfg.TTL)
	if !errors.Is(ta.Err(), baton.ErrExpired) {
		t.Fatalf("a's term ended with %v, want ErrExpired", ta.Err())
	}
	proxy.Heal()
	w := testkit.WaitTerm(t, got, cfg.TTL)
	if sid := conn.SessionID(); sid != session || conn.State() != zk.StateHasSession {
		t.Fatalf("when b won, a's client had session 0x%x in state %v; want its old session 0x%x, alive: "+
			"b must have won by a's deleting its node, not by the server expiring a's session", sid, conn.State(), session)
	}
	t.Logf("b won %s after a was cut off; the server would not expire a's session before %s",
		w.At.Sub(cutAt).Round(time.Millisecond), cfg.TTL-cfg.RenewInterval)
	if w.Term.Token() <= ta.Token() {
		t.Errorf("b's token %d is not above a's %d", w.Term.Token(), ta.Token())
	}
	// a campaigns again on the same session, in a new generation.
	again := testkit.CampaignAsync(t, a, "revived", "a")
	testkit.Eventually(t, 5*time.Second, "a to queue again", func() bool { return len(children(t, raw, latch)) == 2 })
	if err := w.Term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ta2 := testkit.WaitTerm(t, again, 5*time.Second)
	if ta2.Term.Token() <= w.Term.Token() || conn.SessionID() != session {
		t.Errorf("a's new term: token %d (b's %d), session 0x%x (was 0x%x)", ta2.Term.Token(), w.Term.Token(), conn.SessionID(), session)
	}
}

// TestOperatorDeleteEndsTerm: deleting the holder's node (zkCli.sh delete)
// is how an operator forces a hand-over, so the holder must notice and stop.
func TestOperatorDeleteEndsTerm(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	a := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Root: root}})
	raw := rawConn(t, srv.Addr())
	latch := root + "/deleted"

	ta := testkit.CampaignWithin(t, a, "deleted", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "deleted", "b")
	testkit.Eventually(t, 5*time.Second, "b to queue", func() bool { return len(children(t, raw, latch)) == 2 })
	first := children(t, raw, latch)
	slices.SortFunc(first, func(x, y string) int { return strings.Compare(x[len(x)-10:], y[len(y)-10:]) })
	if err := raw.Delete(latch+"/"+first[0], -1); err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, ta, 5*time.Second)
	if !errors.Is(ta.Err(), baton.ErrLeaseLost) {
		t.Errorf("after the node was deleted, Err() = %v, want ErrLeaseLost", ta.Err())
	}
	tb := testkit.WaitTerm(t, got, 5*time.Second)
	if tb.Term.Token() <= ta.Token() {
		t.Errorf("b's token %d is not above a's %d", tb.Term.Token(), ta.Token())
	}
	// a's name is free again: it can queue behind b.
	again := testkit.CampaignAsync(t, a, "deleted", "a")
	if err := tb.Term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ta2 := testkit.WaitTerm(t, again, 5*time.Second); ta2.Term.Token() <= tb.Term.Token() {
		t.Errorf("a's new token %d is not above b's %d", ta2.Term.Token(), tb.Term.Token())
	}
}

// TestCloseHandsOverAtOnce, for a Backend from Dial (which closes its
// session) and one from New (which deletes its nodes and leaves the
// caller's connection open).
func TestCloseHandsOverAtOnce(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	cfg := backend.Config{TTL: 10 * time.Second}
	for _, owned := range []bool{true, false} {
		name := map[bool]string{true: "Dial", false: "New"}[owned]
		t.Run(name, func(t *testing.T) {
			root := uniqueRoot(t)
			var a *zookeeper.Backend
			var conn *zk.Conn
			if owned {
				a = dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: root}})
			} else {
				var probe *zookeeper.SessionProbe
				conn, probe = connect(t, srv.Addr(), cfg)
				a = newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
			}
			b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: root}})
			ta := testkit.CampaignWithin(t, a, "closing", "a", 10*time.Second)
			other := testkit.CampaignWithin(t, a, "other", "a", 10*time.Second)
			got := testkit.CampaignAsync(t, b, "closing", "b")
			raw := rawConn(t, srv.Addr())
			testkit.Eventually(t, 5*time.Second, "b to queue", func() bool { return len(children(t, raw, root+"/closing")) == 2 })
			closed := time.Now()
			if err := a.Close(testkit.Context(t, 5*time.Second)); err != nil {
				t.Fatalf("Close: %v", err)
			}
			for _, term := range []baton.Term{ta, other} {
				if !errors.Is(term.Err(), baton.ErrClosed) {
					t.Errorf("after Close, %s's Err() = %v, want ErrClosed", term.Lease(), term.Err())
				}
			}
			// Well within the 10 s TTL: the Close, not expiry, let b in.
			w := testkit.WaitTerm(t, got, 3*time.Second)
			t.Logf("hand-over after Close took %s", w.At.Sub(closed))
			if kids := children(t, raw, root+"/other"); len(kids) != 0 {
				t.Errorf("Close left %q behind", kids)
			}
			// A Campaign and a Close after Close: batontest's
			// CloseEndsTermsAndRefusesCampaigns.
			if _, err := a.Leader(testkit.Context(t, time.Second), "closing"); !errors.Is(err, baton.ErrClosed) {
				t.Errorf("Leader after Close: err = %v, want ErrClosed", err)
			}
			if !owned {
				if _, _, err := conn.Exists("/"); err != nil || conn.State() != zk.StateHasSession {
					t.Errorf("the caller's connection after Close: %v, state %v; want it open", err, conn.State())
				}
			}
		})
	}
}

// TestNegotiatedTimeoutTimesSafeUntil: asked for more than its
// maxSessionTimeout, the server grants less, and expires the session after
// what it granted: safe-until must be timed by that, not by the TTL.
func TestNegotiatedTimeoutTimesSafeUntil(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	cfg := backend.Config{TTL: testserver.ZooKeeperMaxSessionTimeout + 5*time.Second}
	logs := newLogRecorder()
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: uniqueRoot(t), Logger: logs.logger()}})
	full, _ := (backend.Config{TTL: cfg.TTL, RenewInterval: cfg.TTL / 6}).WithDefaults() // the backend's defaults
	start := time.Now()
	term := testkit.CampaignWithin(t, b, "clamped", "x", 10*time.Second)
	elapsed := time.Since(start)
	granted := testserver.ZooKeeperMaxSessionTimeout
	// The granted timeout less DriftMargin: the server is standalone, so
	// there is no ensemble lag.
	want := granted - full.DriftMargin
	if got := term.SafeUntil().Sub(start); got < want || got > want+elapsed {
		t.Errorf("SafeUntil is %s after the campaign began; want %s (timed by the granted %s), not the TTL's %s",
			got, want, granted, full.TTL-full.DriftMargin)
	}
	logs.await(t, "ZooKeeper negotiated a session timeout other than the TTL; safe-until is timed by it", time.Second)
}

// TestLongerNegotiatedTimeoutStretchesNothing: asked for less than its
// minSessionTimeout, the server grants more; safe-until stays timed by the
// client's own TTL from each renewal's send time (a client believes no
// server about time), checked after every renewal for a second.
func TestLongerNegotiatedTimeoutStretchesNothing(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	cfg := backend.Config{TTL: testserver.ZooKeeperMinSessionTimeout * 4 / 5}
	b := dial(t, srv.Addr(), zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: uniqueRoot(t)}})
	full, _ := (backend.Config{TTL: cfg.TTL, RenewInterval: cfg.TTL / 6}).WithDefaults() // the backend's defaults
	limit := full.TTL - full.DriftMargin
	term := testkit.CampaignWithin(t, b, "unstretched", "x", 10*time.Second)
	first := term.SafeUntil()
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if ahead := time.Until(term.SafeUntil()); ahead > limit {
			t.Fatalf("SafeUntil is %s ahead with the server's %s granted; want at most the TTL's %s", ahead, testserver.ZooKeeperMinSessionTimeout, limit)
		}
	}
	if term.Err() != nil || !term.SafeUntil().After(first) {
		t.Fatalf("the term was not renewed (err %v): the check above saw no renewal", term.Err())
	}
}

func TestInvalidOptionsAndNames(t *testing.T) {
	if _, err := zookeeper.New(nil, zookeeper.Options{}); err == nil {
		t.Error("New(nil conn) succeeded")
	}
	srv := testserver.SharedZooKeeper(t)
	conn := rawConn(t, srv.Addr())
	for _, opts := range []zookeeper.Options{
		{Config: backend.Config{TTL: -time.Second}},
		{Root: "baton"},
		{Root: "/baton/"},
		{Root: "/a//b"},
		{Root: "/a/../b"},
		{Root: "/a\x00b"},
		{ACL: []zk.ACL{}},
	} {
		if _, err := zookeeper.New(conn, opts); err == nil {
			t.Errorf("New(%+v) succeeded", opts)
		}
	}
	// Every problem at once, with or without a connection.
	twoWrongs := zookeeper.Options{Config: backend.Config{TTL: -time.Second}, Root: "relative"}
	_, err := zookeeper.New(conn, twoWrongs)
	var cerr *baton.ConfigError
	if !errors.As(err, &cerr) || len(cerr.Problems) != 2 {
		t.Errorf("New with two mistakes: %v; want a ConfigError naming both", err)
	}
	if err := twoWrongs.Validate(); !errors.As(err, &cerr) || len(cerr.Problems) != 2 {
		t.Errorf("Validate with two mistakes: %v; want a ConfigError naming both", err)
	}
	if err := (zookeeper.Options{}).Validate(); err != nil {
		t.Errorf("Validate of the zero Options: %v", err)
	}
	if _, err := zookeeper.Dial(testkit.Context(t, time.Second), nil, zookeeper.DialOptions{}); !errors.As(err, &cerr) {
		t.Errorf("Dial without servers: %v; want a ConfigError", err)
	}
	if _, err := zookeeper.New(conn, zookeeper.Options{Root: "/"}); err != nil {
		t.Errorf("Root \"/\": %v", err)
	}
	b := newBackend(t, conn, zookeeper.Options{Root: uniqueRoot(t)})
	for _, name := range []string{"", "a/b", ".", "..", "x\x00y", "x\u0085y"} {
		if _, err := b.Campaign(testkit.Context(t, time.Second), name, baton.Candidate{ID: "x"}); err == nil {
			t.Errorf("Campaign(%q) succeeded", name)
		}
		if err := zookeeper.CheckName(name); err == nil {
			t.Errorf("CheckName(%q) = nil", name)
		}
	}
	if _, err := b.Campaign(testkit.Context(t, time.Second), "ok", baton.Candidate{}); err == nil {
		t.Errorf("Campaign with an empty candidate ID succeeded")
	}
	if _, err := b.Leader(testkit.Context(t, time.Second), "nobody"); !errors.Is(err, baton.ErrNoLeader) {
		t.Errorf("Leader of a latch that does not exist: err = %v, want ErrNoLeader", err)
	}
}

// TestUnwiredProbeIsRefused: a probe the connection was not dialed through
// knows no negotiated timeout. The Backend must say so rather than time
// safe-until by the TTL, which the server may not have granted.
func TestUnwiredProbeIsRefused(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	conn := rawConn(t, srv.Addr()) // dialed through a probe of its own
	b := newBackend(t, conn, zookeeper.Options{Root: uniqueRoot(t), Probe: zookeeper.NewSessionProbe(nil)})
	_, err := b.Campaign(testkit.Context(t, 10*time.Second), "unwired", baton.Candidate{ID: "x"})
	if !errors.Is(err, baton.ErrBackendUnavailable) || !strings.Contains(err.Error(), "Probe has not seen") {
		t.Errorf("Campaign with a probe that saw no session: err = %v, want ErrBackendUnavailable naming the probe", err)
	}
}

// An unreachable ZooKeeper must surface as ErrBackendUnavailable, so the
// Elector logs it and retries, rather than a campaign that blocks silently.
func TestUnreachableServerIsReported(t *testing.T) {
	// Waits out timeouts rather than working: runs beside the others.
	t.Parallel()
	srv := testserver.SharedZooKeeper(t)
	proxy := testserver.StartProxy(t, srv.Addr())
	proxy.Cut()
	_, err := zookeeper.Dial(testkit.Context(t, 2*time.Second), []string{proxy.Addr()}, zookeeper.DialOptions{})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("Dial to an unreachable server: err = %v, want ErrBackendUnavailable", err)
	}
	cfg := backend.Config{TTL: time.Second}
	conn, probe := connect(t, proxy.Addr(), cfg)
	b := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: uniqueRoot(t), Probe: probe})
	_, err = b.Campaign(testkit.Context(t, time.Minute), "unreachable", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("Campaign against an unreachable server: err = %v, want ErrBackendUnavailable", err)
	}
}

// logRecorder is a slog handler that lets a test wait for a message.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
	more chan struct{} // closed and replaced on each record
}

func newLogRecorder() *logRecorder { return &logRecorder{more: make(chan struct{})} }

func (r *logRecorder) logger() *slog.Logger { return slog.New(r) }

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	close(r.more)
	r.more = make(chan struct{})
	r.mu.Unlock()
	return nil
}

// await waits until msg has been logged.
func (r *logRecorder) await(t testing.TB, msg string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		found := slices.Contains(r.msgs, msg)
		more := r.more
		r.mu.Unlock()
		if found {
			return
		}
		select {
		case <-more:
		case <-deadline:
			t.Fatalf("%q not logged within %s", msg, timeout)
		}
	}
}
