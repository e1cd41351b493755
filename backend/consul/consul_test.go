package consul_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// TestMain stops the agent the package's tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopSharedConsul()
	os.Exit(code)
}

func TestConformance(t *testing.T) { batontest.Run(t, target(t)) }

// TestLeaderWatch: a standby hears who leads from the Backend's watch
// (baton.LeaderWatcher), without asking.
func TestLeaderWatch(t *testing.T) { batontest.LeaderWatch(t, target(t)) }

// target is the conformance suite's Target: processes on one server.
func target(t *testing.T) batontest.Target {
	agent := testserver.SharedConsul(t)
	prefix := testPrefix()
	return batontest.Target{
		OneCampaignPerName: true,
		// The holder's safe window on Consul is TTL/2 - DriftMargin (see
		// the package doc): at 2 s it is 0.8 s, as etcd's is at 1 s. At 1 s
		// it would be 0.4 s, which a loaded CI machine cannot keep renewing.
		MinTTL: 2 * time.Second,
		New: func(t *testing.T, cfg backend.Config) *batontest.Process {
			// Each process reaches the agent through a proxy of its own, so
			// that cutting one off leaves the others connected.
			proxy := testserver.StartProxy(t, agent.Addr())
			var once sync.Once
			killed := make(chan struct{})
			b := newBackend(t, agentClient(t, agent, proxy.Addr()), consul.Options{Config: cfg, Prefix: prefix}, killed)
			return &batontest.Process{
				Backend: b,
				// A process killed with -9 never releases its locks or
				// destroys its session: cut it off for good.
				Kill: func() {
					once.Do(func() {
						close(killed)
						proxy.Cut()
					})
				},
				Cut: proxy.Cut,
				Heal: func() {
					select {
					case <-killed:
					default:
						proxy.Heal()
					}
				},
			}
		},
	}
}

// testPrefix returns a key prefix of its own for a test on the shared agent.
func testPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "test-" + hex.EncodeToString(b[:]) + "/"
}

// newBackend returns a Backend on client, closed when the test ends. A
// killed process's Close cannot reach the agent, so it gets a moment only.
func newBackend(t *testing.T, client *api.Client, opts consul.Options, killed <-chan struct{}) *consul.Backend {
	t.Helper()
	b, err := consul.New(client, opts)
	if err != nil {
		t.Fatalf("consul.New: %v", err)
	}
	t.Cleanup(func() {
		d := 5 * time.Second
		select {
		case <-killed:
			d = 10 * time.Millisecond
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		if err := b.Close(ctx); err != nil && killed == nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

// notYet fails the test if got delivers a term within d: a positive claim
// ("the waiter keeps waiting") can only be observed for a while.
func notYet(t *testing.T, got <-chan testkit.Won, d time.Duration) {
	t.Helper()
	select {
	case w := <-got:
		if w.Term != nil {
			t.Fatalf("acquired token %d while the lease was held", w.Term.Token())
		}
		t.FailNow()
	case <-time.After(d):
	}
}

// sessionOf returns the session holding key, failing if none does.
func sessionOf(t *testing.T, c *api.Client, key string) string {
	t.Helper()
	p, _, err := c.KV().Get(key, nil)
	if err != nil || p == nil || p.Session == "" {
		t.Fatalf("key %s: %+v, %v; want it locked", key, p, err)
	}
	return p.Session
}

// TestKeyAndSessionLayout checks what `consul lock` relies on: the key, its
// flags and its lock, and a session as documented.
func TestKeyAndSessionLayout(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 3 * time.Second}, Prefix: prefix}, nil)
	if got := b.SessionTTL(); got != 1500*time.Millisecond {
		t.Errorf("SessionTTL() = %s, want TTL/2 = 1.5s", got)
	}
	if got := b.LockDelay(); got != 500*time.Millisecond {
		t.Errorf("LockDelay() = %s, want TTL/6 = 500ms", got)
	}
	if got := b.Config().RenewInterval; got != 750*time.Millisecond {
		t.Errorf("RenewInterval = %s, want half the session TTL = TTL/4 = 750ms", got)
	}
	key, err := b.Key("nightly/report")
	if err != nil || key != prefix+"nightly/report/.lock" {
		t.Fatalf("Key(nightly/report) = %q, %v; want %q", key, err, prefix+"nightly/report/.lock")
	}
	start := time.Now()
	term := testkit.CampaignWithin(t, b, "nightly/report", "host-1/abcd", 10*time.Second)
	// Read SafeUntil before took, and before the requests below: a renewal
	// sent after took was measured (every 750 ms) would move it further.
	safeUntil := term.SafeUntil()
	took := time.Since(start)
	p, _, err := c.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
	if err != nil || p == nil {
		t.Fatalf("get %s: %+v, %v", key, p, err)
	}
	if p.Flags != api.LockFlagValue || string(p.Value) != "host-1/abcd" || p.Session == "" || tokenAt(t, c, b, "nightly/report", p.ModifyIndex) != term.Token() {
		t.Errorf("key %s = flags %#x, value %q, session %q, index %d; want flags %#x, the candidate ID, locked, epoch<<32 + index = token %d",
			key, p.Flags, p.Value, p.Session, p.ModifyIndex, uint64(api.LockFlagValue), term.Token())
	}
	info, _, err := c.Session().Info(p.Session, nil)
	if err != nil || info == nil {
		t.Fatalf("session %s: %+v, %v", p.Session, info, err)
	}
	if info.Name != consul.DefaultSessionName || info.TTL != "1500ms" || info.LockDelay != 500*time.Millisecond ||
		info.Behavior != api.SessionBehaviorRelease || len(info.NodeChecks) != 0 || len(info.Checks) != 0 || len(info.ServiceChecks) != 0 {
		t.Errorf("session = %+v; want name baton, TTL 1500ms, lock-delay 500ms, behavior release, no checks", info)
	}
	// Safe-until trusts Consul's promise of one session TTL, from the send
	// of the session's creation: 1.5 s - 0.3 s.
	if got := safeUntil.Sub(start); got < 1200*time.Millisecond || got > 1200*time.Millisecond+took {
		t.Errorf("SafeUntil is %s after the campaign began, which took %s; want TTL/2 - DriftMargin = 1.2s after the session was created", got, took)
	}
	// Resign deletes the key, as `consul lock` cleans up after unlocking.
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if p, _, err := c.KV().Get(key, nil); err != nil || p != nil {
		t.Errorf("after Resign, key %s = %+v, %v; want it deleted", key, p, err)
	}
}

// countingTransport counts the requests matching count.
type countingTransport struct {
	rt    http.RoundTripper
	count func(*http.Request) bool
	n     atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.count(r) {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// TestWaiterWakesByBlockingQuery: a waiter sits in one blocking query, sends
// nothing else while it waits, and wakes at once when the lock goes.
func TestWaiterWakesByBlockingQuery(t *testing.T) {
	agent := testserver.SharedConsul(t)
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: testPrefix()}
	a := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	var lists atomic.Int64
	ct := &countingTransport{rt: http.DefaultTransport.(*http.Transport).Clone(), count: func(r *http.Request) bool {
		// Everything but session renewals, which run whatever the waiter does.
		if strings.HasPrefix(r.URL.Path, "/v1/session/renew/") {
			return false
		}
		if strings.HasPrefix(r.URL.Path, "/v1/kv/") && r.URL.Query().Has("recurse") {
			lists.Add(1)
		}
		return true
	}}
	bc, err := api.NewClient(&api.Config{Address: agent.Addr(), HttpClient: &http.Client{Transport: ct}})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, bc, opts, nil)

	ta := testkit.CampaignWithin(t, a, "wake", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "wake", "b")
	// b's first query (no index) answers at once; the second is the
	// blocking one. Counting from the first would count the second as a
	// request sent while waiting.
	testkit.EventuallyErr(t, 10*time.Second, "b to start its blocking query", func() error {
		if lists.Load() < 2 {
			return errors.New("b has not started its blocking query")
		}
		return nil
	})
	before := ct.n.Load()
	notYet(t, got, 2*time.Second)
	if n := ct.n.Load() - before; n != 0 {
		t.Errorf("b sent %d requests in 2s of waiting; want none beyond its blocking query", n)
	}
	t.Logf("b sent %d requests to start waiting (session, read, holder's session, watch)", before)
	resigned := time.Now()
	if err := ta.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	w := testkit.WaitTerm(t, got, 5*time.Second)
	// The 20 s TTL rules out a takeover by expiry: the delete woke b.
	t.Logf("hand-over took %s, with %d requests in all", w.At.Sub(resigned), ct.n.Load())
	if w.Term.Token() <= ta.Token() {
		t.Errorf("b's token %d is not greater than a's %d", w.Term.Token(), ta.Token())
	}
}

// TestAgentErrorsRiddenOut: a holder cut off from the agent for less than
// its safe window keeps its term, renewing once it can again; cut off for
// longer, it stops at its safe-until with ErrExpired.
func TestAgentErrorsRiddenOut(t *testing.T) {
	agent := testserver.SharedConsul(t)
	proxy := testserver.StartProxy(t, agent.Addr())
	b := newBackend(t, agentClient(t, agent, proxy.Addr()), consul.Options{Config: backend.Config{TTL: 4 * time.Second}, Prefix: testPrefix()}, nil)
	term := testkit.CampaignWithin(t, b, "flaky", "a", 10*time.Second)

	// Cut right after a renewal, for a quarter of the 1.6 s safe window.
	first := term.SafeUntil()
	testkit.EventuallyErr(t, 5*time.Second, "a renewal before the cut", func() error {
		if !term.SafeUntil().After(first) {
			return errors.New("no renewal yet")
		}
		return nil
	})
	cutAt := term.SafeUntil()
	proxy.Cut()
	time.Sleep(400 * time.Millisecond) // the outage itself
	proxy.Heal()
	testkit.EventuallyErr(t, 5*time.Second, "a renewal after the outage", func() error {
		if err := term.Err(); err != nil {
			t.Fatalf("the term ended during a 400ms outage: %v", err)
		}
		if !term.SafeUntil().After(cutAt) {
			return errors.New("no renewal since the outage")
		}
		return nil
	})

	// Now for good: the term ends at its safe-until, not before, not later.
	proxy.Cut()
	ended := testkit.WaitDone(t, term, 10*time.Second)
	if !errors.Is(term.Err(), baton.ErrExpired) {
		t.Errorf("after a long outage, Err() = %v; want ErrExpired", term.Err())
	}
	if d := ended.Sub(term.SafeUntil()); d < 0 || d > 100*time.Millisecond {
		t.Errorf("the term ended %s after its safe-until; want at it", d)
	}
	proxy.Heal()
	// Healed, the Backend starts a new session and can lead again.
	testkit.EventuallyErr(t, 20*time.Second, "a campaign once healed", func() error {
		again, err := b.Campaign(testkit.Context(t, 10*time.Second), "flaky", baton.Candidate{ID: "a"})
		if err != nil {
			return err
		}
		if again.Token() <= term.Token() {
			t.Errorf("token %d after the outage is not greater than %d", again.Token(), term.Token())
		}
		return nil
	})
}

// TestCloseHandsOverWithoutLockDelay: Close deletes the keys before it
// destroys the session, so a standby takes over at once even with a long
// lock-delay, which Consul applies to a destroyed session's locks.
func TestCloseHandsOverWithoutLockDelay(t *testing.T) {
	agent := testserver.SharedConsul(t)
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, LockDelay: 30 * time.Second, Prefix: testPrefix()}
	a := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	b := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	ta := testkit.CampaignWithin(t, a, "closing", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "closing", "b")
	notYet(t, got, 200*time.Millisecond)
	if err := a.Close(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !errors.Is(ta.Err(), baton.ErrClosed) {
		t.Errorf("after Close, Err() = %v, want ErrClosed", ta.Err())
	}
	// Well within the 30 s lock-delay and the 20 s TTL.
	testkit.WaitTerm(t, got, 5*time.Second)
	// A Campaign and a Close after Close: batontest's
	// CloseEndsTermsAndRefusesCampaigns.
	if _, err := a.Leader(testkit.Context(t, time.Second), "closing"); !errors.Is(err, baton.ErrClosed) {
		t.Errorf("Leader after Close: err = %v, want ErrClosed", err)
	}
}

// TestSessionDestroyedEndsTermsAndLockDelayHolds: `consul session destroy`
// ends every term riding on the session at once; the lock-delay keeps
// others out for its length, and a waiter that knows it waits it out
// instead of polling.
func TestSessionDestroyedEndsTermsAndLockDelayHolds(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	const delay = 1500 * time.Millisecond
	a := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, LockDelay: delay, Prefix: prefix}, nil)
	ct := &countingTransport{rt: http.DefaultTransport.(*http.Transport).Clone(), count: func(r *http.Request) bool {
		return !strings.HasPrefix(r.URL.Path, "/v1/session/renew/")
	}}
	bc, err := api.NewClient(&api.Config{Address: agent.Addr(), HttpClient: &http.Client{Transport: ct}})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, bc, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)

	t1 := testkit.CampaignWithin(t, a, "one", "a", 10*time.Second)
	t2 := testkit.CampaignWithin(t, a, "two", "a", 10*time.Second)
	sid := sessionOf(t, c, prefix+"one/.lock")
	if s2 := sessionOf(t, c, prefix+"two/.lock"); s2 != sid {
		t.Fatalf("leases of one Backend ride on different sessions: %s, %s", sid, s2)
	}
	got := testkit.CampaignAsync(t, b, "one", "b")
	notYet(t, got, 300*time.Millisecond)
	before := ct.n.Load()
	destroyed := time.Now()
	if _, err := c.Session().Destroy(sid, nil); err != nil {
		t.Fatal(err)
	}
	for _, term := range []baton.Term{t1, t2} {
		testkit.WaitDone(t, term, 5*time.Second)
		if !errors.Is(term.Err(), baton.ErrLeaseLost) {
			t.Errorf("%s: Err() = %v, want ErrLeaseLost", term.Lease(), term.Err())
		}
	}
	w := testkit.WaitTerm(t, got, 10*time.Second)
	took := w.At.Sub(destroyed)
	t.Logf("b took over %s after the destroy (lock-delay %s), with %d requests", took, delay, ct.n.Load()-before)
	if took < delay-100*time.Millisecond {
		t.Errorf("b took over %s after the destroy, within the %s lock-delay", took, delay)
	}
	if took > delay+time.Second {
		t.Errorf("b took over %s after the destroy; want soon after the %s lock-delay", took, delay)
	}
	// wake, lock refused, session check, one retry at the delay's end (plus
	// its term's watch): not a poll.
	if n := ct.n.Load() - before; n > 8 {
		t.Errorf("b sent %d requests while the lock-delay ran; want a handful", n)
	}
	// a starts a new session for its next campaign.
	t3 := testkit.CampaignWithin(t, a, "two", "a", 10*time.Second)
	if s := sessionOf(t, c, prefix+"two/.lock"); s == sid {
		t.Errorf("after its session was destroyed, a campaigned with it again")
	}
	if t3.Token() <= t2.Token() {
		t.Errorf("token %d after the destroy is not greater than %d", t3.Token(), t2.Token())
	}
}

// TestOperatorDeleteEndsTerm: `consul kv delete` of the lock key is how an
// operator forces a hand-over; the holder must notice and stop.
func TestOperatorDeleteEndsTerm(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}
	a := newBackend(t, c, opts, nil)
	b := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	ta := testkit.CampaignWithin(t, a, "deleted", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "deleted", "b")
	notYet(t, got, 200*time.Millisecond)
	out, err := exec.Command(agent.Binary(), "kv", "delete", "-http-addr="+agent.Addr(), prefix+"deleted/.lock").CombinedOutput()
	if err != nil {
		t.Fatalf("consul kv delete: %v\n%s", err, out)
	}
	testkit.WaitDone(t, ta, 5*time.Second)
	if !errors.Is(ta.Err(), baton.ErrLeaseLost) {
		t.Errorf("after consul kv delete, Err() = %v, want ErrLeaseLost", ta.Err())
	}
	tb := testkit.WaitTerm(t, got, 5*time.Second).Term
	if tb.Token() <= ta.Token() {
		t.Errorf("b's token %d is not greater than a's %d", tb.Token(), ta.Token())
	}
	// a's name is free again: it waits behind b, and wins when b resigns.
	got = testkit.CampaignAsync(t, a, "deleted", "a")
	notYet(t, got, 200*time.Millisecond)
	if err := tb.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ta2 := testkit.WaitTerm(t, got, 5*time.Second).Term; ta2.Token() <= tb.Token() {
		t.Errorf("a's new token %d is not greater than b's %d", ta2.Token(), tb.Token())
	}
}

// TestOverwrittenKeyEndsTerm: a plain write to a held key keeps Consul's
// lock but changes the key's index, and so the token Leader reports; the
// term ends, and the lock is let go.
func TestOverwrittenKeyEndsTerm(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)
	term := testkit.CampaignWithin(t, b, "rewritten", "a", 10*time.Second)
	if _, err := c.KV().Put(&api.KVPair{Key: prefix + "rewritten/.lock", Flags: api.LockFlagValue, Value: []byte("someone")}, nil); err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, term, 5*time.Second)
	if !errors.Is(term.Err(), baton.ErrLeaseLost) {
		t.Errorf("after an overwrite, Err() = %v, want ErrLeaseLost", term.Err())
	}
	again := testkit.CampaignWithin(t, b, "rewritten", "a", 10*time.Second)
	if again.Token() <= term.Token() {
		t.Errorf("token %d after the overwrite is not greater than %d", again.Token(), term.Token())
	}
}

// TestHealthCheckInvalidatesSession: a session tied to a health check is
// invalidated when the check fails; every term on it is lost, and with the
// default lock-delay (the session TTL) nobody takes the lock for that long.
func TestHealthCheckInvalidatesSession(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	check := "baton-" + strings.TrimSuffix(prefix, "/")
	if err := c.Agent().CheckRegister(&api.AgentCheckRegistration{
		ID: check, Name: "baton test check",
		AgentServiceCheck: api.AgentServiceCheck{TTL: "1h", Status: api.HealthPassing},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Agent().CheckDeregister(check) })
	// Sessions can use a check only once the servers know it.
	testkit.EventuallyErr(t, 10*time.Second, "the servers to know the check, passing", func() error {
		checks, _, err := c.Health().Node("baton-test", nil)
		if err != nil {
			return err
		}
		for _, hc := range checks {
			if hc.CheckID == check && hc.Status == api.HealthPassing {
				return nil
			}
		}
		return errors.New("check not in the catalog yet")
	})

	cfg := backend.Config{TTL: 4 * time.Second}
	if _, err := consul.New(c, consul.Options{Config: cfg, Checks: []string{check}, LockDelay: time.Second}); err == nil {
		t.Error("New accepted a lock-delay below the session TTL with checks")
	}
	a := newBackend(t, c, consul.Options{Config: cfg, Checks: []string{check}, Prefix: prefix}, nil)
	if a.LockDelay() != a.SessionTTL() {
		t.Errorf("with checks, LockDelay() = %s, want the session TTL %s", a.LockDelay(), a.SessionTTL())
	}
	b := newBackend(t, agentClient(t, agent, agent.Addr()), consul.Options{Config: cfg, Prefix: prefix}, nil)
	ta := testkit.CampaignWithin(t, a, "checked", "a", 10*time.Second)
	info, _, err := c.Session().Info(sessionOf(t, c, prefix+"checked/.lock"), nil)
	if err != nil || info == nil || len(info.NodeChecks) != 1 || info.NodeChecks[0] != check {
		t.Fatalf("session %+v, %v; want node check %s", info, err, check)
	}
	got := testkit.CampaignAsync(t, b, "checked", "b")
	notYet(t, got, 200*time.Millisecond)
	failed := time.Now()
	if err := c.Agent().FailTTL(check, "failing on purpose"); err != nil {
		t.Fatal(err)
	}
	ended := testkit.WaitDone(t, ta, 5*time.Second)
	if !errors.Is(ta.Err(), baton.ErrLeaseLost) {
		t.Errorf("after the check failed, Err() = %v, want ErrLeaseLost", ta.Err())
	}
	w := testkit.WaitTerm(t, got, 10*time.Second)
	t.Logf("term ended %s after the check failed; b took over %s after", ended.Sub(failed), w.At.Sub(failed))
	if d := w.At.Sub(failed); d < a.LockDelay() {
		t.Errorf("b took over %s after the check failed, within the %s lock-delay", d, a.LockDelay())
	}
	if !ended.Before(w.At) {
		t.Errorf("b acquired at %v, before a's term ended at %v", w.At, ended)
	}
}

func TestInvalidOptionsAndNames(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	_, err := consul.New(nil, consul.Options{
		Config:      backend.Config{TTL: 2 * time.Second, RenewInterval: 900 * time.Millisecond},
		LockDelay:   2 * time.Minute,
		Prefix:      "/abs/",
		MaxRequests: -1,
	})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 5 {
		t.Errorf("New with five problems: err = %v; want a ConfigError listing all five", err)
	}
	for _, p := range []string{"a//b/", "a/./", "../x/"} {
		if _, err := consul.New(c, consul.Options{Prefix: p}); err == nil {
			t.Errorf("New accepted Prefix %q, which `consul lock` would clean to another key", p)
		}
	}
	for name, want := range map[string]string{"x": "baton/x/.lock", "a/b": "baton/a/b/.lock"} {
		if got, err := (consul.Options{}).Key(name); got != want || err != nil {
			t.Errorf("Options{}.Key(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := (consul.Options{Prefix: "a//"}).Key("x"); err == nil {
		t.Error("Options.Key accepted an unclean Prefix")
	}
	b := newBackend(t, c, consul.Options{Prefix: testPrefix()}, nil)
	for _, name := range []string{"", "/a", "a/", "a//b", "a/../b", "."} {
		if _, err := b.Campaign(testkit.Context(t, time.Second), name, baton.Candidate{ID: "x"}); err == nil {
			t.Errorf("Campaign(%q) succeeded", name)
		}
	}
	if _, err := b.Campaign(testkit.Context(t, time.Second), "ok", baton.Candidate{}); err == nil {
		t.Error("Campaign with an empty candidate ID succeeded")
	}
	if _, err := b.Leader(testkit.Context(t, time.Second), "nobody"); !errors.Is(err, baton.ErrNoLeader) {
		t.Errorf("Leader of a free lease: err = %v, want ErrNoLeader", err)
	}
}

// A session TTL below the servers' session_ttl_min fails with an error that
// says what to do.
func TestSessionTTLBelowServerMinimum(t *testing.T) {
	agent := testserver.SharedConsul(t)
	b := newBackend(t, agentClient(t, agent, agent.Addr()), consul.Options{
		Config: backend.Config{TTL: testserver.ConsulSessionTTLMin, DriftMargin: time.Millisecond, RenewInterval: 10 * time.Millisecond},
		Prefix: testPrefix(),
	}, nil)
	_, err := b.Campaign(testkit.Context(t, 10*time.Second), "short", baton.Candidate{ID: "x"})
	var ttlErr *consul.SessionTTLError
	var ce *baton.ConfigError
	if !errors.As(err, &ttlErr) || !errors.As(err, &ce) || !strings.Contains(err.Error(), "session_ttl_min") {
		t.Errorf("Campaign with a session TTL below the minimum: err = %v; want a SessionTTLError (a ConfigError) naming session_ttl_min", err)
	}
	if errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("Campaign with a session TTL below the minimum: err = %v says the backend is unavailable; retrying cannot fix it", err)
	}
}

// An unreachable agent must surface as ErrBackendUnavailable, so the Elector
// logs it and retries, instead of a campaign that blocks silently.
func TestUnreachableAgentIsReported(t *testing.T) {
	agent := testserver.SharedConsul(t)
	proxy := testserver.StartProxy(t, agent.Addr())
	proxy.Cut()
	killed := make(chan struct{})
	close(killed) // its Close cannot reach the agent either
	b := newBackend(t, agentClient(t, agent, proxy.Addr()), consul.Options{Config: backend.Config{TTL: time.Second}, Prefix: testPrefix()}, killed)
	// Each gives up after its request bound (5 s); both at once.
	leaderErr := make(chan error, 1)
	go func() {
		_, err := b.Leader(testkit.Context(t, time.Minute), "unreachable")
		leaderErr <- err
	}()
	_, err := b.Campaign(testkit.Context(t, time.Minute), "unreachable", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("Campaign against an unreachable agent: err = %v, want ErrBackendUnavailable", err)
	}
	if err := <-leaderErr; !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("Leader against an unreachable agent: err = %v, want ErrBackendUnavailable", err)
	}
}

// hookTransport lets a test act on requests as they pass: before a request
// is sent (hold it, say), and around it (do something at the server
// first, or drop its answer).
type hookTransport struct {
	rt   http.RoundTripper
	hook func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error)
}

func (h *hookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return h.hook(r, func() (*http.Response, error) { return h.rt.RoundTrip(r) })
}

func hookedClient(t *testing.T, agent *testserver.Consul, hook func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error)) *api.Client {
	t.Helper()
	ht := &hookTransport{rt: http.DefaultTransport.(*http.Transport).Clone(), hook: hook}
	c, err := api.NewClient(&api.Config{Address: agent.Addr(), HttpClient: &http.Client{Transport: ht}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func isList(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/kv/") && r.URL.Query().Has("recurse")
}

func isTxn(r *http.Request) bool { return r.Method == http.MethodPut && r.URL.Path == "/v1/txn" }

// isLockTxn reports whether r is a transaction that locks a lease's lock
// key (not a read, nor a queue entry's lock). It reads r's body and puts it
// back.
func isLockTxn(t *testing.T, r *http.Request) bool {
	return txnHas(t, r, func(op *api.KVTxnOp) bool { return op.Verb == api.KVLock && strings.HasSuffix(op.Key, "/.lock") })
}

// txnHas reports whether r is a transaction with a KV op for which match
// is true. It leaves r's body to be sent.
func txnHas(t *testing.T, r *http.Request, match func(*api.KVTxnOp) bool) bool {
	if !isTxn(r) || r.Body == nil {
		return false
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Errorf("read a transaction's body: %v", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var ops api.TxnOps
	if err := json.Unmarshal(body, &ops); err != nil {
		t.Errorf("decode a transaction: %v", err)
	}
	for _, op := range ops {
		if op.KV != nil && match(op.KV) {
			return true
		}
	}
	return false
}

// TestWaiterWakesAfterLosingARace: a waiter whose lock loses a race (the key
// changed between the state it saw and its transaction) must wake on the
// watch's next answer even when that answer shows the key as the waiter
// last saw it: free, because the winner has already deleted it again.
// A watch that took such an answer for "unchanged" would leave the waiter
// asleep on a free key until something else changed it.
func TestWaiterWakesAfterLosingARace(t *testing.T) {
	agent := testserver.SharedConsul(t)
	other := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	key := prefix + "race/.lock"
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}
	e := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)

	// D is a plain API user that wins the race: it locks the key while the
	// waiter's transaction is on its way, and deletes it once that failed.
	sid, _, err := other.Session().Create(&api.SessionEntry{TTL: "30s", Behavior: api.SessionBehaviorRelease}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = other.Session().Destroy(sid, nil) })

	var (
		lists     atomic.Int64
		gateArmed atomic.Bool
		gate      = make(chan struct{})
		txnArmed  atomic.Bool
		raced     = make(chan error, 1)
	)
	cc := hookedClient(t, agent, func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error) {
		switch {
		case isList(r):
			lists.Add(1)
			if gateArmed.Load() {
				// The watch's next query reads the key only after the race.
				select {
				case <-gate:
				case <-r.Context().Done(): // Close, should the race never come
					return nil, r.Context().Err()
				}
			}
		case isLockTxn(t, r) && txnArmed.CompareAndSwap(true, false):
			defer close(gate)
			if ok, _, err := other.KV().Acquire(&api.KVPair{Key: key, Session: sid, Flags: api.LockFlagValue, Value: []byte("d")}, nil); !ok || err != nil {
				raced <- fmt.Errorf("D's lock: %v, %v", ok, err)
				return send()
			}
			resp, err := send()
			if _, derr := other.KV().Delete(key, nil); derr != nil {
				raced <- derr
				return resp, err
			}
			if err == nil && resp.StatusCode != http.StatusConflict {
				raced <- fmt.Errorf("the waiter's transaction answered %s; want 409, the race lost", resp.Status)
			}
			raced <- nil
			return resp, err
		}
		return send()
	})
	c := newBackend(t, cc, opts, nil)

	te := testkit.CampaignWithin(t, e, "race", "e", 10*time.Second)
	got := testkit.CampaignAsync(t, c, "race", "c")
	// The first query answers at once; the second is the blocking one.
	testkit.EventuallyErr(t, 10*time.Second, "the waiter to start its blocking query", func() error {
		if lists.Load() < 2 {
			return errors.New("the waiter is not in its blocking query yet")
		}
		return nil
	})
	notYet(t, got, 100*time.Millisecond)
	gateArmed.Store(true)
	txnArmed.Store(true)
	if err := te.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-raced:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never tried to lock the key after the holder resigned")
	}
	w := testkit.WaitTerm(t, got, 5*time.Second)
	if w.Term.Token() <= te.Token() {
		t.Errorf("token %d is not greater than the resigned holder's %d", w.Term.Token(), te.Token())
	}
}

// TestLostLockReplyLeavesNoLock: a lock transaction that lands but whose
// answer is lost must not leave the key locked by the Backend's session
// with no term to release it, which would block every other candidate for
// as long as the Backend lives.
func TestLostLockReplyLeavesNoLock(t *testing.T) {
	agent := testserver.SharedConsul(t)
	prefix := testPrefix()
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}
	var drop atomic.Bool
	drop.Store(true)
	ac := hookedClient(t, agent, func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error) {
		lock := isLockTxn(t, r)
		resp, err := send()
		if lock && err == nil && drop.CompareAndSwap(true, false) {
			resp.Body.Close()
			return nil, errors.New("connection reset (the test dropped the answer)")
		}
		return resp, err
	})
	a := newBackend(t, ac, opts, nil)
	b := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	_, err := a.Campaign(testkit.Context(t, 10*time.Second), "lost", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Fatalf("Campaign whose answer was lost: err = %v, want ErrBackendUnavailable", err)
	}
	if drop.Load() {
		t.Fatal("no lock transaction was sent")
	}
	if rec, err := b.Leader(testkit.Context(t, 5*time.Second), "lost"); !errors.Is(err, baton.ErrNoLeader) {
		t.Errorf("after a's campaign failed, Leader = %+v, %v; want ErrNoLeader", rec, err)
	}
	// Another candidate wins at once, not after a's session ends.
	tb := testkit.CampaignWithin(t, b, "lost", "b", 10*time.Second)
	// And a can campaign again, behind b.
	got := testkit.CampaignAsync(t, a, "lost", "a")
	notYet(t, got, 200*time.Millisecond)
	if err := tb.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitTerm(t, got, 5*time.Second)
}

// TestLostEnqueueReplyLeavesNoEntry: a transaction that joins a lease's
// line but whose answer is lost must not leave the campaign's entry in
// line, locked by the Backend's live session with no campaign behind it:
// every waiter behind it would wait for as long as the Backend lives, and
// the lease stay free.
func TestLostEnqueueReplyLeavesNoEntry(t *testing.T) {
	agent := testserver.SharedConsul(t)
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: testPrefix()}
	var drop atomic.Bool
	drop.Store(true)
	ac := hookedClient(t, agent, func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error) {
		enqueue := txnHas(t, r, func(op *api.KVTxnOp) bool { return op.Verb == api.KVSet && strings.HasSuffix(op.Key, "/.baton-tail") })
		resp, err := send()
		if enqueue && err == nil && drop.CompareAndSwap(true, false) {
			resp.Body.Close()
			return nil, errors.New("connection reset (the test dropped the answer)")
		}
		return resp, err
	})
	a := newBackend(t, ac, opts, nil)
	h := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	b := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	th := testkit.CampaignWithin(t, h, "line", "h", 10*time.Second)
	_, err := a.Campaign(testkit.Context(t, 10*time.Second), "line", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Fatalf("Campaign whose joining the line lost its answer: err = %v, want ErrBackendUnavailable", err)
	}
	if drop.Load() {
		t.Fatal("no transaction joined the line")
	}
	// b joins the line behind a's entry, if a left it there.
	got := testkit.CampaignAsync(t, b, "line", "b")
	notYet(t, got, 200*time.Millisecond)
	if err := th.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if w := testkit.WaitTerm(t, got, 10*time.Second); w.Term == nil {
		t.Fatal("b's campaign failed")
	}
}

// holdBack returns a client whose first transaction matching match is
// not sent: the client sees its answer lost, and the test gets its body,
// to send late with replay.
func holdBack(t *testing.T, agent *testserver.Consul, match func(*api.KVTxnOp) bool) (*api.Client, <-chan []byte) {
	late := make(chan []byte, 1)
	c := hookedClient(t, agent, func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error) {
		if txnHas(t, r, match) {
			body, _ := io.ReadAll(r.Body)
			select {
			case late <- body:
				return nil, errors.New("connection reset (the test holds the request back)")
			default:
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		return send()
	})
	return c, late
}

// replay sends a transaction held back by holdBack, as a server that got
// it late would apply it.
func replay(t *testing.T, agent *testserver.Consul, late <-chan []byte) {
	t.Helper()
	var body []byte
	select {
	case body = <-late:
	default:
		t.Fatal("no transaction was held back")
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://"+agent.Addr()+"/v1/txn", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok := agent.ManagementToken(); tok != "" {
		req.Header.Set("X-Consul-Token", tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// lateLine is what the tests of writes landing late share: on the shared
// agent, under a prefix of their own, Backend a, whose first transaction
// matching match is held back (holdBack), Backend h holding lease "late",
// and Backend b.
type lateLine struct {
	agent *testserver.Consul
	opts  consul.Options
	a, b  *consul.Backend
	th    baton.Term // h's term
	late  <-chan []byte
}

func newLateLine(t *testing.T, match func(*api.KVTxnOp) bool) lateLine {
	t.Helper()
	l := lateLine{agent: testserver.SharedConsul(t)}
	l.opts = consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: testPrefix()}
	var ac *api.Client
	ac, l.late = holdBack(t, l.agent, match)
	l.a = newBackend(t, ac, l.opts, nil)
	h := newBackend(t, agentClient(t, l.agent, l.agent.Addr()), l.opts, nil)
	l.b = newBackend(t, agentClient(t, l.agent, l.agent.Addr()), l.opts, nil)
	l.th = testkit.CampaignWithin(t, h, "late", "h", 10*time.Second)
	return l
}

// inLine waits until the line of lease "late" has n entries.
func (l lateLine) inLine(t *testing.T, who string, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, who+" to join the line", func() bool {
		pairs, _, err := agentClient(t, l.agent, l.agent.Addr()).KV().List(l.opts.Prefix+"late/.baton-queue/", nil)
		return err == nil && len(pairs) == n
	})
}

// tombstones returns the keys in the queue folder of lease "late" under
// prefix that no session holds and that no line ever held (never locked):
// the released keys a campaign's clean-up puts where a write whose answer
// was lost might still land.
func tombstones(t *testing.T, agent *testserver.Consul, prefix string) []string {
	t.Helper()
	pairs, _, err := agentClient(t, agent, agent.Addr()).KV().List(prefix+"late/.baton-queue/", nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, p := range pairs {
		if p.Session == "" && p.LockIndex == 0 {
			keys = append(keys, p.Key)
		}
	}
	return keys
}

// closeLeavesNoTombstones checks that the clean-up of a's failed campaign
// left a released key where its write might land, and that a's Close,
// once its session is gone and no such write can land, deletes it.
func closeLeavesNoTombstones(t *testing.T, agent *testserver.Consul, prefix string, a *consul.Backend) {
	t.Helper()
	if keys := tombstones(t, agent, prefix); len(keys) == 0 {
		t.Fatal("the failed campaign's clean-up left no released key in the queue folder")
	}
	if err := a.Close(testkit.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if keys := tombstones(t, agent, prefix); len(keys) > 0 {
		t.Errorf("after Close, the queue folder still holds %v, released keys of the closed Backend's session", keys)
	}
}

// TestLateQueueWriteLeavesNoEntry: a campaign's write to its entry in line
// (naming the entry before it) whose answer is lost may still land after
// the campaign ended and released the entry; landing, it must not lock
// the entry again, which would hold up every waiter behind it for as long
// as the Backend lives.
func TestLateQueueWriteLeavesNoEntry(t *testing.T) {
	l := newLateLine(t, func(op *api.KVTxnOp) bool {
		// The write naming the entry before ours: a lock of our entry
		// with a value.
		return op.Verb == api.KVLock && strings.Contains(op.Key, "/.baton-queue/") && len(op.Value) > 0
	})
	c := newBackend(t, agentClient(t, l.agent, l.agent.Addr()), l.opts, nil)
	gotC := testkit.CampaignAsync(t, c, "late", "c")
	l.inLine(t, "c", 1)
	// a joins behind c; its write naming c's entry is held back and fails.
	_, err := l.a.Campaign(testkit.Context(t, 10*time.Second), "late", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Fatalf("Campaign whose queue write failed: err = %v, want ErrBackendUnavailable", err)
	}
	replay(t, l.agent, l.late) // after a released its entry
	gotB := testkit.CampaignAsync(t, l.b, "late", "b")
	if err := l.th.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	wc := testkit.WaitTerm(t, gotC, 10*time.Second)
	if wc.Term == nil {
		t.Fatal("c's campaign failed")
	}
	if err := wc.Term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if w := testkit.WaitTerm(t, gotB, 10*time.Second); w.Term == nil {
		t.Fatal("b's campaign failed")
	}
}

// TestLateEnqueueLeavesNoEntry: a transaction that joins a lease's line
// whose answer is lost may land after the campaign ended and cleaned up;
// landing, it must not put a live entry in line, which would hold up
// every waiter behind it for as long as the Backend lives.
func TestLateEnqueueLeavesNoEntry(t *testing.T) {
	l := newLateLine(t, func(op *api.KVTxnOp) bool {
		return op.Verb == api.KVSet && strings.HasSuffix(op.Key, "/.baton-tail")
	})
	_, err := l.a.Campaign(testkit.Context(t, 10*time.Second), "late", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Fatalf("Campaign whose joining the line failed: err = %v, want ErrBackendUnavailable", err)
	}
	replay(t, l.agent, l.late) // after a's campaign ended
	gotB := testkit.CampaignAsync(t, l.b, "late", "b")
	notYet(t, gotB, 100*time.Millisecond)
	if err := l.th.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if w := testkit.WaitTerm(t, gotB, 10*time.Second); w.Term == nil {
		t.Fatal("b's campaign failed")
	}
	closeLeavesNoTombstones(t, l.agent, l.opts.Prefix, l.a)
}

// TestLateLockFromLineTakesNothing: the lock transaction of a campaign
// first in line whose answer is lost may land after the campaign ended
// and released its entry; landing, it must not take the key, which no
// term would then release for as long as the Backend lives.
func TestLateLockFromLineTakesNothing(t *testing.T) {
	l := newLateLine(t, func(op *api.KVTxnOp) bool {
		// A lock of the lease's key that also deletes an entry in line.
		return op.Verb == api.KVDelete && strings.Contains(op.Key, "/.baton-queue/")
	})
	errA := make(chan error, 1)
	go func() {
		_, err := l.a.Campaign(testkit.Context(t, time.Minute), "late", baton.Candidate{ID: "a"})
		errA <- err
	}()
	l.inLine(t, "a", 1)
	if err := l.th.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// a, first in line, locks; its transaction is held back and fails.
	select {
	case err := <-errA:
		if !errors.Is(err, baton.ErrBackendUnavailable) {
			t.Fatalf("Campaign whose lock failed: err = %v, want ErrBackendUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a's campaign did not end after its lock failed")
	}
	replay(t, l.agent, l.late) // after a's campaign ended
	if rec, err := l.b.Leader(testkit.Context(t, 5*time.Second), "late"); !errors.Is(err, baton.ErrNoLeader) {
		t.Errorf("after a's late lock, Leader = %+v, %v; want nobody", rec, err)
	}
	testkit.CampaignWithin(t, l.b, "late", "b", 10*time.Second)
}

// TestLateFreeLockTakesNothing: the lock transaction of a campaign that
// found the lease free and nobody in line, whose answer is lost, may land
// after the campaign ended and cleaned up; landing, it must not take the
// key, which no term would then release for as long as the Backend lives.
func TestLateFreeLockTakesNothing(t *testing.T) {
	agent := testserver.SharedConsul(t)
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: testPrefix()}
	ac, late := holdBack(t, agent, func(op *api.KVTxnOp) bool {
		return op.Verb == api.KVLock && strings.HasSuffix(op.Key, "/.lock")
	})
	a := newBackend(t, ac, opts, nil)
	b := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	// The lease has been held before: its epoch key exists, and a's lock
	// is the one transaction its campaign sends.
	if err := testkit.CampaignWithin(t, b, "late", "b", 10*time.Second).Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := a.Campaign(testkit.Context(t, 10*time.Second), "late", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Fatalf("Campaign whose lock failed: err = %v, want ErrBackendUnavailable", err)
	}
	replay(t, agent, late) // after a's campaign ended
	if rec, err := b.Leader(testkit.Context(t, 5*time.Second), "late"); !errors.Is(err, baton.ErrNoLeader) {
		t.Errorf("after a's late lock, Leader = %+v, %v; want nobody", rec, err)
	}
	testkit.CampaignWithin(t, b, "late", "b", 10*time.Second)
	closeLeavesNoTombstones(t, agent, opts.Prefix, a)
}

// TestCloseBoundedWhenAgentVanishes: Close with a context without deadline
// returns even when the agent stops answering (its connections hang, as
// when its host vanished): it stops trying to delete its locks when the
// session's safe-until passes, and bounds the destroy like any request.
func TestCloseBoundedWhenAgentVanishes(t *testing.T) {
	agent := testserver.SharedConsul(t)
	proxy := testserver.StartProxy(t, agent.Addr())
	b, err := consul.New(agentClient(t, agent, proxy.Addr()), consul.Options{Config: backend.Config{TTL: 2 * time.Second}, Prefix: testPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	term := testkit.CampaignWithin(t, b, "vanish", "a", 10*time.Second)
	proxy.Cut()
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- b.Close(context.Background()) }()
	// The safe window (0.8 s) plus the 5 s bound of the destroy, and slack.
	select {
	case err := <-closed:
		t.Logf("Close returned after %s: %v", time.Since(start), err)
		if err == nil {
			t.Errorf("Close against an agent that does not answer returned no error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close(context.Background()) hangs while the agent does not answer")
	}
	if !errors.Is(term.Err(), baton.ErrClosed) {
		t.Errorf("after Close, Err() = %v, want ErrClosed", term.Err())
	}
}
