package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// These tests run the Backend against a real three-server ensemble and
// kill servers under it with SIGKILL: a follower, the leader (which makes
// the other two elect a new one), and two of three (which loses the
// quorum until they are back).

// ensembleConfig is the timing of the ensemble tests. The session timeout
// (10 s, granted as asked) is far above a reconnection, which takes the
// client up to a second per round of its server list, plus a ZooKeeper
// leader election when the leader died. A renewal every second keeps the
// ensemble lag short: each confirmed renewal keeps the terms safe for
// 10 - 10/4 - 1 - 1 (DriftMargin) = 5.5 s after its send time, so at least
// 4.5 s are left when a server dies.
var ensembleConfig = backend.Config{TTL: 10 * time.Second, RenewInterval: time.Second}

// TestEnsembleFollowerLossKeepsTerm: the holder's server, a follower, is
// killed. The client moves to another server within the session timeout:
// the session, and the term riding on it, must carry on (same term, same
// token, renewals confirmed through the new server) and the waiting
// candidate must keep waiting until the holder resigns.
func TestEnsembleFollowerLossKeepsTerm(t *testing.T) {
	testServerLossKeepsTerm(t, false)
}

// TestEnsembleLeaderLossKeepsSession: the holder's server is the
// ensemble's leader; killing it makes the other two elect a new leader,
// during which neither serves. The session must survive the election (the
// new leader takes over every session with a fresh timeout). The term
// survives too if the client is back and a renewal confirmed before its
// safe-until, which the timing leaves room for; should the election and
// reconnection take longer, the term must end with baton.ErrExpired at its
// safe-until, not before the client could have been back, and the next
// holder must win only after that.
func TestEnsembleLeaderLossKeepsSession(t *testing.T) {
	testServerLossKeepsTerm(t, true)
}

func testServerLossKeepsTerm(t *testing.T, killLeader bool) {
	el := newEventLog(t)
	ens := testserver.StartZooKeeperEnsemble(t, 3)
	cfg := ensembleConfig
	leader := ens.LeaderIndex()
	if leader < 0 {
		t.Fatal("no server of the ensemble says it leads")
	}
	target := leader
	if !killLeader {
		target = (leader + 1) % ens.Len()
	}
	h := ensembleHolder(t, ens, target, cfg, el, "steady")
	latch, connA, ta, b, raw := h.latch, h.connA, h.ta, h.b, h.raw
	var got <-chan testkit.Won
	var bFailed *atomic.Int32
	if killLeader {
		// b's server may be a follower, which stops serving while it
		// looks for the new leader: b's own generation could reach its
		// safe-until, failing its campaign, which is the Backend's
		// promise and not this test's subject. b campaigns again then, as
		// an Elector would.
		got, bFailed = campaignRetrying(t, b, "steady", "b", el)
	} else {
		got = testkit.CampaignAsync(t, b, "steady", "b")
	}
	testkit.Eventually(t, 10*time.Second, "b to queue", func() bool { return len(children(t, raw, latch)) == 2 })
	session := connA.SessionID()
	before := ta.SafeUntil()
	killedAt := time.Now()
	el.logf("test: killing server %d (%s), the %s, which a's session 0x%x is on; a's term is safe for %s more",
		target, ens.Addrs()[target], map[bool]string{true: "leader", false: "follower"}[killLeader],
		session, time.Until(before).Round(time.Millisecond))
	ens.Kill(target)
	ended := endTime(ta)

	if killLeader {
		testkit.Eventually(t, 60*time.Second, "the two servers left to elect a leader", func() bool { return ens.LeaderIndex() >= 0 })
		el.logf("test: server %d leads, %s after the kill", ens.LeaderIndex(), time.Since(killedAt).Round(time.Millisecond))
	}
	testkit.Eventually(t, cfg.TTL, "a's client to be back on another server", func() bool {
		return connA.State() == zk.StateHasSession && connA.Server() != ens.Addrs()[target]
	})
	backAt := time.Now()
	el.logf("test: a's client is back on %s, %s after the kill", connA.Server(), backAt.Sub(killedAt).Round(time.Millisecond))
	if sid := connA.SessionID(); sid != session {
		t.Fatalf("a's client has session 0x%x after the kill, want its old 0x%x: the session must outlive the loss of one server", sid, session)
	}
	// A renewal confirmed after the client was back went through the new
	// server; wait for one, or for the term to end.
	since := ta.SafeUntil()
	testkit.Eventually(t, cfg.TTL, "a renewal through the new server, or the term's end", func() bool {
		return ta.SafeUntil().After(since) || ta.Err() != nil
	})

	if err := ta.Err(); err != nil {
		if !killLeader {
			t.Fatalf("a's term ended when a follower was killed: %v", err)
		}
		// The election and reconnection outlasted the term's safe-until.
		// That is allowed only as documented: ErrExpired, at safe-until,
		// and only if the client was not back in time for a renewal
		// (retried every RenewInterval/4 while failing) to land first.
		endedAt := <-ended
		el.logf("test: a's term ended: %v", err)
		if !errors.Is(err, baton.ErrExpired) {
			t.Errorf("a's term ended with %v, want ErrExpired: the session outlived the election", err)
		}
		if endedAt.Before(ta.SafeUntil()) {
			t.Errorf("a's term ended at %v, before its safe-until %v", endedAt, ta.SafeUntil())
		}
		if slack := cfg.RenewInterval/4 + time.Second; backAt.Add(slack).Before(ta.SafeUntil()) {
			t.Errorf("a's term expired although its client was back %s before its safe-until",
				ta.SafeUntil().Sub(backAt).Round(time.Millisecond))
		}
		w := testkit.WaitTerm(t, got, 30*time.Second)
		if w.At.Before(ta.SafeUntil()) {
			t.Errorf("b won at %v, before a's term was over at %v", w.At, ta.SafeUntil())
		}
		if w.Term.Token() <= ta.Token() {
			t.Errorf("b's token %d is not above a's %d", w.Term.Token(), ta.Token())
		}
		t.Logf("a's term expired during the leader election (client back %s after the kill); b took over",
			backAt.Sub(killedAt).Round(time.Millisecond))
		return
	}

	el.logf("test: a's term lives on, safe until %s from now", time.Until(ta.SafeUntil()).Round(time.Millisecond))
	select {
	case <-ta.Done():
		t.Fatalf("a's Done is closed while Err is nil")
	default:
	}
	if !ta.SafeUntil().After(before) {
		t.Errorf("a's safe-until did not move past %v after the reconnection", before)
	}
	rec, err := b.Leader(testkit.Context(t, 10*time.Second), "steady")
	if err != nil || rec.Holder != "a" || rec.Token != ta.Token() {
		t.Errorf("Leader = %+v, %v; want a, with its token %d unchanged", rec, err, ta.Token())
	}
	select {
	case w := <-got:
		t.Fatalf("b won (token %v) while a's term lasted", w.Term)
	default:
	}
	// Renewals carry on, not just one.
	next := ta.SafeUntil()
	testkit.Eventually(t, cfg.TTL, "another renewal", func() bool { return ta.SafeUntil().After(next) })
	if err := ta.Err(); err != nil {
		t.Fatalf("a's term ended after renewals resumed: %v", err)
	}
	resigned := time.Now()
	if err := ta.Resign(testkit.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	w := testkit.WaitTerm(t, got, 30*time.Second)
	if w.At.Before(resigned) {
		t.Errorf("b won at %v, before a resigned at %v", w.At, resigned)
	}
	if w.Term.Token() <= ta.Token() {
		t.Errorf("b's token %d is not above a's %d", w.Term.Token(), ta.Token())
	}
	if bFailed != nil && bFailed.Load() > 0 {
		t.Logf("b's campaign failed %d time(s) during the election and was retried", bFailed.Load())
	}
}

// TestEnsembleQuorumLossEndsTermBySafeUntil: with two of three servers
// killed, no server serves and nothing can be confirmed. The holder's term
// must end by the safe-until it had when the quorum went, with
// baton.ErrExpired: the session may well be alive once the quorum is back
// (the new leader gives every session a fresh timeout), so it is not
// lost. Once the servers are back the leftover node must be cleared and a
// campaign must win, with a higher token, after the old term's end; the
// next one must wait for it.
func TestEnsembleQuorumLossEndsTermBySafeUntil(t *testing.T) {
	el := newEventLog(t)
	ens := testserver.StartZooKeeperEnsemble(t, 3)
	cfg := ensembleConfig
	leader := ens.LeaderIndex()
	if leader < 0 {
		t.Fatal("no server of the ensemble says it leads")
	}
	// a is on a follower, and the leader and the other follower are
	// killed: a's server then forwards nothing anywhere, so no renewal can
	// be confirmed after the kills. (A leader left alone would answer
	// syncs for a moment, until it sees its followers gone.)
	target := (leader + 1) % ens.Len()
	other := (leader + 2) % ens.Len()
	h := ensembleHolder(t, ens, target, cfg, el, "quorum")
	latch, connA, a, ta, b, raw := h.latch, h.connA, h.a, h.ta, h.b, h.raw
	// b's own generation reaches its safe-until without the quorum too,
	// failing its campaign; it campaigns again, as an Elector would.
	gotB, bFailed := campaignRetrying(t, b, "quorum", "b", el)
	testkit.Eventually(t, 10*time.Second, "b to queue", func() bool { return len(children(t, raw, latch)) == 2 })
	session := connA.SessionID()

	// Kill right after a renewal was confirmed, so that the next one
	// (a second later) cannot slip in between reading safe-until and the
	// kills, however slow the kills are.
	last := ta.SafeUntil()
	testkit.Eventually(t, cfg.TTL, "a fresh renewal", func() bool { return ta.SafeUntil().After(last) })
	before := ta.SafeUntil()
	ended := endTime(ta)
	el.logf("test: killing servers %d and %d (the leader); a's session 0x%x stays on %d, safe for %s more",
		other, leader, session, target, time.Until(before).Round(time.Millisecond))
	ens.Kill(other)
	ens.Kill(leader)
	lostAt := time.Now()

	endedAt := testkit.WaitDone(t, ta, time.Until(before)+10*time.Second)
	select {
	case endedAt = <-ended: // when Done closed, not when this goroutine saw it
	default:
	}
	el.logf("test: a's term ended %s after the quorum was lost: %v", endedAt.Sub(lostAt).Round(time.Millisecond), ta.Err())
	if !errors.Is(ta.Err(), baton.ErrExpired) {
		t.Errorf("a's term ended with %v, want ErrExpired: nobody could expire the session without a quorum", ta.Err())
	}
	// The term's timer fires at safe-until; allow for scheduling.
	const slack = 500 * time.Millisecond
	if late := endedAt.Sub(before); late > slack {
		t.Errorf("a's term ended %s after the safe-until it had when the quorum was lost", late.Round(time.Millisecond))
	}
	if !ta.SafeUntil().Equal(before) {
		t.Errorf("a's safe-until moved from %v to %v after the quorum was lost: a renewal was confirmed without one",
			before, ta.SafeUntil())
	}
	if mode := ens.Mode(target); mode != "" {
		t.Errorf("server %d, alone, says it is %q: the test meant it to have lost the quorum", target, mode)
	}
	select {
	case w := <-gotB:
		t.Fatalf("b won (token %v) without a quorum", w.Term)
	default:
	}

	el.logf("test: restarting servers %d and %d", other, leader)
	for _, i := range []int{other, leader} {
		if err := ens.Restart(i); err != nil {
			t.Fatalf("restart server %d: %v", i, err)
		}
	}
	testkit.Eventually(t, 30*time.Second, "a leader", func() bool { return ens.LeaderIndex() >= 0 })
	el.logf("test: quorum back, %s after it was lost; server %d leads", time.Since(lostAt).Round(time.Millisecond), ens.LeaderIndex())
	gotA := testkit.CampaignAsync(t, a, "quorum", "a")

	// Whoever wins first must come after a's old term, with a higher
	// token; the other must wait for it.
	var first, second testkit.Won
	var waiting <-chan testkit.Won
	var firstName, secondName string
	select {
	case first = <-gotA:
		firstName, secondName, waiting = "a", "b", gotB
	case first = <-gotB:
		firstName, secondName, waiting = "b", "a", gotA
	case <-time.After(60 * time.Second):
		t.Fatalf("nobody won within 60 s of the quorum's return")
	}
	if first.Term == nil {
		t.FailNow() // campaignAsync reported why
	}
	el.logf("test: %s won token %d", firstName, first.Term.Token())
	if first.Term.Token() <= ta.Token() {
		t.Errorf("%s's token %d is not above a's old %d", firstName, first.Term.Token(), ta.Token())
	}
	if !first.At.After(endedAt) {
		t.Errorf("%s won at %v, before a's old term ended at %v", firstName, first.At, endedAt)
	}
	if connA.SessionID() == session {
		t.Logf("a's session 0x%x outlived the loss of the quorum, as expected: its old node had to be deleted by the Backend", session)
	}
	select {
	case w := <-waiting:
		t.Fatalf("%s won token %v while %s's term %d lasted", secondName, w.Term, firstName, first.Term.Token())
	default:
	}
	resigned := time.Now()
	if err := first.Term.Resign(testkit.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	second = testkit.WaitTerm(t, waiting, 30*time.Second)
	if second.At.Before(resigned) {
		t.Errorf("%s won at %v, before %s resigned at %v", secondName, second.At, firstName, resigned)
	}
	if second.Term.Token() <= first.Term.Token() {
		t.Errorf("%s's token %d is not above %s's %d", secondName, second.Term.Token(), firstName, first.Term.Token())
	}
	t.Logf("b's campaign failed %d time(s) without the quorum and was retried", bFailed.Load())
}

// holderSetup is what ensembleHolder returns.
type holderSetup struct {
	latch string             // the lease's latch path
	connA *zk.Conn           // a's connection, on the chosen server
	a, b  *zookeeper.Backend // b, on the whole ensemble, has not campaigned
	ta    baton.Term         // a's term
	raw   *zk.Conn           // for looking at the latch
}

// ensembleHolder has a Backend a, with its session on server target of
// ens, win lease (under a fresh root), and makes a second Backend b.
func ensembleHolder(t *testing.T, ens *testserver.ZooKeeperEnsemble, target int, cfg backend.Config, el *eventLog, lease string) holderSetup {
	t.Helper()
	root := uniqueRoot(t)
	connA, probe := connectEnsemble(t, ens, target, cfg, el, "a")
	a := newBackend(t, connA, zookeeper.Options{Config: cfg, Root: root, Probe: probe, Logger: el.logger("a")})
	b := dialEnsemble(t, ens, zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: root, Logger: el.logger("b")}})
	raw := rawEnsembleConn(t, ens)
	ta := testkit.CampaignWithin(t, a, lease, "a", 10*time.Second)
	if got := ens.Index(connA.Server()); got != target {
		t.Fatalf("a's session is on server %d (%s), want %d", got, connA.Server(), target)
	}
	// An ensemble's member is never taken for a standalone server, whose
	// renewals would be timed without the ensemble lag.
	if standalone, interval, ok := zookeeper.RenewalMode(a); !ok || standalone || interval != a.Config().RenewInterval {
		t.Fatalf("a renews as standalone %v, every %s (live generation: %v); want syncs every RenewInterval (%s), as on an ensemble",
			standalone, interval, ok, a.Config().RenewInterval)
	}
	return holderSetup{latch: root + "/" + lease, connA: connA, a: a, b: b, ta: ta, raw: raw}
}

func connectEnsemble(t testing.TB, ens *testserver.ZooKeeperEnsemble, first int, cfg backend.Config, el *eventLog, who string) (*zk.Conn, *zookeeper.SessionProbe) {
	t.Helper()
	cfg, err := cfg.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	addrs := ens.Addrs()
	probe := zookeeper.NewSessionProbe(nil)
	conn, _, err := zk.Connect(addrs, cfg.TTL,
		zk.WithDialer(probe.Dial),
		zk.WithHostProvider(&startAt{first: addrs[first]}),
		zk.WithLogger(el.clientLogger(who)),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession {
				el.logf("%s client: %s %s", who, ev.State, ev.Server)
			}
		}))
	if err != nil {
		t.Fatalf("connect to %s: %v", strings.Join(addrs, ","), err)
	}
	t.Cleanup(conn.Close)
	return conn, probe
}

// dialEnsemble returns a Backend from Dial with every server of the
// ensemble, closed when the test ends.
func dialEnsemble(t testing.TB, ens *testserver.ZooKeeperEnsemble, opts zookeeper.DialOptions) *zookeeper.Backend {
	t.Helper()
	b, err := zookeeper.Dial(testkit.Context(t, 30*time.Second), ens.Addrs(), opts)
	if err != nil {
		t.Fatalf("zookeeper.Dial %s: %v", strings.Join(ens.Addrs(), ","), err)
	}
	return testkit.CloseAtEnd(t, b, 5*time.Second)
}

// rawEnsembleConn returns a plain client of the whole ensemble, for
// looking at the tree.
func rawEnsembleConn(t testing.TB, ens *testserver.ZooKeeperEnsemble) *zk.Conn {
	t.Helper()
	conn, _, err := zk.Connect(ens.Addrs(), 10*time.Second, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// startAt is a zk.HostProvider that tries server first before the
// others, where zk.DNSHostProvider (and zk.Connect, which shuffles the list
// before handing it over) picks at random: the test then knows which
// server a session starts on. Otherwise it behaves alike: after a failed
// connection it moves on to the next server, and it reports a round
// (which makes the client pause for a second) once it is back at the last
// server it was connected to.
type startAt struct {
	first string

	mu         sync.Mutex
	servers    []string
	curr, last int
}

func (h *startAt) Init(servers []string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := slices.Index(servers, h.first)
	if i < 0 {
		return fmt.Errorf("%s is not among the servers %q", h.first, servers)
	}
	h.servers = append([]string{h.first}, slices.Delete(slices.Clone(servers), i, i+1)...)
	h.curr, h.last = -1, -1
	return nil
}

func (h *startAt) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.servers)
}

func (h *startAt) Next() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.curr = (h.curr + 1) % len(h.servers)
	retryStart := h.curr == h.last
	if h.last == -1 {
		h.last = 0
	}
	return h.servers[h.curr], retryStart
}

func (h *startAt) Connected() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = h.curr
}

// campaignRetrying campaigns in the background as an Elector would: a
// campaign that fails with baton.ErrBackendUnavailable (ZooKeeper could
// not be reached, or the Backend's session generation reached its
// safe-until while it waited) is tried again after a pause; any other
// error fails the test. It delivers the term with the time it was won, or
// a nil term after reporting the error, and counts the failures.
func campaignRetrying(t testing.TB, b *zookeeper.Backend, lease, id string, el *eventLog) (<-chan testkit.Won, *atomic.Int32) {
	got := make(chan testkit.Won, 1)
	failed := new(atomic.Int32)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	ended := make(chan struct{})
	t.Cleanup(func() { close(ended); cancel() })
	go func() {
		for {
			term, err := b.Campaign(ctx, lease, baton.Candidate{ID: id})
			if err == nil {
				got <- testkit.Won{Term: term, At: time.Now()}
				return
			}
			if errors.Is(err, baton.ErrBackendUnavailable) && ctx.Err() == nil {
				failed.Add(1)
				el.logf("test: %s's campaign failed, trying again: %v", id, err)
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			select {
			case <-ended:
			default:
				t.Errorf("campaign %s for %s: %v", id, lease, err)
			}
			got <- testkit.Won{At: time.Now()}
			return
		}
	}()
	return got, failed
}

// endTime delivers the time term's Done closed.
func endTime(term baton.Term) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		<-term.Done()
		ch <- time.Now()
	}()
	return ch
}

// eventLog collects a test's log lines, from the Backends, the ZooKeeper
// clients and the test itself, each stamped with the time, and shows them
// when the test ends (with -v, or when it failed): what happened around a
// kill, in order.
type eventLog struct {
	mu    sync.Mutex
	lines strings.Builder
}

// newEventLog returns an event log shown when the test ends. Call it before
// making the clients that log to it, so that it is shown after they close.
func newEventLog(t testing.TB) *eventLog {
	el := &eventLog{}
	t.Cleanup(func() {
		el.mu.Lock()
		defer el.mu.Unlock()
		t.Logf("events:\n%s", el.lines.String())
	})
	return el
}

// Write takes lines from a slog.TextHandler, which stamps them itself.
func (el *eventLog) Write(p []byte) (int, error) {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.lines.Write(p)
}

func (el *eventLog) logf(format string, args ...any) {
	line := time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...)
	el.mu.Lock()
	defer el.mu.Unlock()
	el.lines.WriteString(line + "\n")
}

// logger returns a Backend's logger, at debug level.
func (el *eventLog) logger(who string) *slog.Logger {
	h := slog.NewTextHandler(el, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.String(slog.TimeKey, a.Value.Time().Format("15:04:05.000"))
			}
			return a
		},
	})
	return slog.New(h).With("who", who)
}

// clientLogger returns a go-zookeeper client's logger.
func (el *eventLog) clientLogger(who string) zk.Logger { return clientLog{el, who} }

type clientLog struct {
	el  *eventLog
	who string
}

func (l clientLog) Printf(format string, args ...any) {
	l.el.logf("%s client: %s", l.who, fmt.Sprintf(format, args...))
}
