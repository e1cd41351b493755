package consul_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// reqLog records what one Backend's client sends: each request's sequence
// number (one counter for all the logs of a test), and the blocking
// queries in flight.
type reqLog struct {
	rt  http.RoundTripper
	seq *atomic.Int64

	mu       sync.Mutex
	sent     []int64          // sequence numbers of the requests sent, session renewals left out
	blocking map[int64]string // blocking queries in flight: sequence number -> path
}

func (l *reqLog) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasPrefix(r.URL.Path, "/v1/session/renew/") {
		// A session's renewals run whatever its candidates do.
		return l.rt.RoundTrip(r)
	}
	n := l.seq.Add(1)
	idx := r.URL.Query().Get("index")
	blocking := r.Method == http.MethodGet && idx != "" && idx != "0"
	l.mu.Lock()
	l.sent = append(l.sent, n)
	if blocking {
		l.blocking[n] = r.URL.Path
	}
	l.mu.Unlock()
	if blocking {
		defer func() {
			l.mu.Lock()
			delete(l.blocking, n)
			l.mu.Unlock()
		}()
	}
	return l.rt.RoundTrip(r)
}

// since counts the requests sent after sequence number n.
func (l *reqLog) since(n int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := 0
	for _, s := range l.sent {
		if s > n {
			c++
		}
	}
	return c
}

// waitingOn reports whether a blocking query sent after sequence number n
// is in flight, and on which path.
func (l *reqLog) waitingOn(n int64) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s, p := range l.blocking {
		if s > n {
			return p, true
		}
	}
	return "", false
}

// blockingNow reports whether any blocking query is in flight.
func (l *reqLog) blockingNow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.blocking) > 0
}

// TestReleaseWakesOneWaiter: N candidates, each in a Backend of its own
// (a process each), wait for one lease; a release wakes one of them, not
// all: the waiters that send anything per hand-over, and the requests
// they send, do not grow with N. The waiters queue under the lease's
// prefix, each watching the one before it, as etcd's concurrency.Election
// and Curator's LeaderLatch do; only the first in line watches the lock
// key.
func TestReleaseWakesOneWaiter(t *testing.T) {
	agent := testserver.SharedConsul(t)
	prefix := testPrefix()
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}
	const (
		n         = 12
		handOvers = 4
	)
	var seq atomic.Int64
	logs := make([]*reqLog, n)
	backends := make([]*consul.Backend, n)
	for i := range backends {
		logs[i] = &reqLog{rt: http.DefaultTransport.(*http.Transport).Clone(), seq: &seq, blocking: map[int64]string{}}
		c, err := api.NewClient(&api.Config{Address: agent.Addr(), Token: agent.ManagementToken(), HttpClient: &http.Client{Transport: logs[i]}})
		if err != nil {
			t.Fatal(err)
		}
		backends[i] = newBackend(t, c, opts, nil)
	}
	holder := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	term := testkit.CampaignWithin(t, holder, "herd", "holder", 10*time.Second)

	type won struct {
		i    int
		term baton.Term
	}
	wins := make(chan won, n)
	waiting := map[int]bool{}
	for i, b := range backends {
		waiting[i] = true
		got := testkit.CampaignAsync(t, b, "herd", fmt.Sprintf("c%02d", i))
		go func() {
			w := <-got
			wins <- won{i, w.Term}
		}()
		// One at a time, so that each joins the line behind the last.
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("candidate %d to wait in a blocking query", i), logs[i].blockingNow)
	}
	lockPath := "/v1/kv/" + prefix + "herd/.lock"
	// settled waits until every waiting candidate is in a blocking query
	// and one of them, sent after mark, watches the lock key.
	settled := func(mark int64) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, "the waiters to settle in their blocking queries", func() bool {
			onLock := false
			for i := range waiting {
				if !logs[i].blockingNow() {
					return false
				}
				if p, ok := logs[i].waitingOn(mark); ok && p == lockPath {
					onLock = true
				}
			}
			return onLock
		})
	}
	settled(0)
	var woke, sent, onLock int
	for h := range handOvers {
		mark := seq.Load()
		if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		var w won
		select {
		case w = <-wins:
		case <-time.After(10 * time.Second):
			t.Fatalf("hand-over %d: no waiter took the lease within 10s of the release", h)
		}
		if w.term == nil {
			t.Fatalf("hand-over %d: candidate %d's campaign failed", h, w.i)
		}
		if w.i != h {
			t.Errorf("hand-over %d: candidate %d took the lease; want candidate %d, the first in line", h, w.i, h)
		}
		delete(waiting, w.i)
		term = w.term
		settled(mark)
		for i := range waiting {
			if c := logs[i].since(mark); c > 0 {
				woke++
				sent += c
			}
			if p, ok := logs[i].waitingOn(mark); ok && p == lockPath {
				onLock++
			}
		}
		sent += logs[w.i].since(mark)
		t.Logf("hand-over %d: candidate %d took the lease; %d waiting candidates sent requests", h, w.i, woke)
	}
	t.Logf("per hand-over, %d waiting candidates: %.1f of the ones left waiting sent requests, %.1f requests in all (the new holder's included), %.1f watch the lock key",
		n, float64(woke)/handOvers, float64(sent)/handOvers, float64(onLock)/handOvers)
	// The new holder's successor in line moves on to watch the lock key;
	// nobody else has anything to do.
	if woke > handOvers {
		t.Errorf("%d hand-overs woke %d waiting candidates that did not take the lease; want at most one each (the next in line), whatever the number waiting (%d)", handOvers, woke, n)
	}
	if onLock > handOvers {
		t.Errorf("after %d hand-overs, %d blocking queries of waiting candidates watched the lock key; want one each (the first in line)", handOvers, onLock)
	}
	if sent > 12*handOvers {
		t.Errorf("%d hand-overs cost %d requests of the candidates; want a handful each, whatever the number waiting (%d)", handOvers, sent, n)
	}
}

// TestQueueSurvivesLeavers: a waiter whose campaign ends takes its entry
// out of the line, and one whose session ends leaves an entry that Consul
// released; either way the waiter behind it moves up and takes the lease
// at the next release, rather than waiting behind an entry that nobody
// will ever release. Dead entries are deleted by the waiter behind them.
func TestQueueSurvivesLeavers(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	queue := prefix + "leave/.baton-queue/"
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}
	holder := newBackend(t, c, opts, nil)
	term := testkit.CampaignWithin(t, holder, "leave", "holder", 10*time.Second)
	entries := func() api.KVPairs {
		t.Helper()
		ps, _, err := c.KV().List(queue, nil)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(ps, func(x, y *api.KVPair) int { return int(x.CreateIndex) - int(y.CreateIndex) })
		return ps
	}
	type outcome struct {
		term baton.Term
		err  error
	}
	// join campaigns in a Backend of its own and waits until it is in line.
	join := func(id string, ctx context.Context) <-chan outcome {
		t.Helper()
		before := len(entries())
		b := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
		got := make(chan outcome, 1)
		go func() {
			term, err := b.Campaign(ctx, "leave", baton.Candidate{ID: id})
			got <- outcome{term, err}
		}()
		testkit.Eventually(t, 10*time.Second, id+" to join the line", func() bool { return len(entries()) > before })
		return got
	}
	wait := func(got <-chan outcome, who string) outcome {
		t.Helper()
		select {
		case o := <-got:
			return o
		case <-time.After(10 * time.Second):
			t.Fatalf("%s's campaign did not return within 10s", who)
		}
		return outcome{}
	}
	ctx := testkit.Context(t, time.Minute)
	actx, cancel := context.WithCancel(ctx)
	gotA := join("a", actx)
	gotB := join("b", ctx)
	gotC := join("c", ctx)
	if n := len(entries()); n != 3 {
		t.Fatalf("queue = %d entries, want 3", n)
	}

	cancel()
	if o := wait(gotA, "a"); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("a's campaign ended with %v, %v; want context.Canceled", o.term, o.err)
	}
	live := func() api.KVPairs {
		var ps api.KVPairs
		for _, p := range entries() {
			if p.Session != "" {
				ps = append(ps, p)
			}
		}
		return ps
	}
	testkit.Eventually(t, 10*time.Second, "a's entry to leave the line", func() bool { return len(live()) == 2 })

	// b's process loses its session (destroyed, as when its node fails):
	// Consul releases b's entry, and c moves up behind the holder.
	bs := live()[0].Session
	if _, err := c.Session().Destroy(bs, nil); err != nil {
		t.Fatal(err)
	}
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	o := wait(gotC, "c")
	if o.err != nil {
		t.Fatalf("c's campaign: %v", o.err)
	}
	select {
	case ob := <-gotB:
		if ob.term != nil {
			t.Fatalf("b, whose session was destroyed, took the lease (token %d) besides c", ob.term.Token())
		}
	default:
	}
	testkit.Eventually(t, 10*time.Second, "no dead entry left in the line", func() bool {
		for _, p := range entries() {
			if p.Session == "" || p.Session == bs {
				return false
			}
		}
		return true
	})
}

// TestRejoinMakesNoCycle: a waiter that leaves the line and joins it again
// at once must not bring its old entry back to life at the end of the
// line: the waiter that was behind it, reading that entry only then, would
// wait behind something that waits behind it, and nobody would take the
// lease when it is released.
func TestRejoinMakesNoCycle(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	queue := prefix + "rejoin/.baton-queue/"
	opts := consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}
	holder := newBackend(t, c, opts, nil)
	term := testkit.CampaignWithin(t, holder, "rejoin", "holder", 10*time.Second)
	live := func() int {
		t.Helper()
		ps, _, err := c.KV().List(queue, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range ps {
			if p.Session != "" {
				n++
			}
		}
		return n
	}
	x := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	xctx, cancel := context.WithCancel(testkit.Context(t, time.Minute))
	xdone := make(chan error, 1)
	go func() {
		_, err := x.Campaign(xctx, "rejoin", baton.Candidate{ID: "x"})
		xdone <- err
	}()
	testkit.Eventually(t, 10*time.Second, "x to join the line", func() bool { return live() == 1 })

	// s reads the entries of the line only once the gate opens.
	var armed atomic.Bool
	gate := make(chan struct{})
	sc := hookedClient(t, agent, func(r *http.Request, send func() (*http.Response, error)) (*http.Response, error) {
		if armed.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/.baton-queue/") && !r.URL.Query().Has("index") {
			select {
			case <-gate:
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		}
		return send()
	})
	s := newBackend(t, sc, opts, nil)
	got := testkit.CampaignAsync(t, s, "rejoin", "s")
	testkit.Eventually(t, 10*time.Second, "s to join the line behind x", func() bool { return live() == 2 })
	armed.Store(true)

	// x leaves the line and joins it again, while s has yet to read what
	// became of x's entry.
	cancel()
	if err := <-xdone; !errors.Is(err, context.Canceled) {
		t.Fatalf("x's campaign ended with %v, want context.Canceled", err)
	}
	gotX := testkit.CampaignAsync(t, x, "rejoin", "x")
	testkit.Eventually(t, 10*time.Second, "x to join the line again", func() bool { return live() == 2 })
	close(gate)

	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	w := testkit.WaitTerm(t, got, 10*time.Second)
	if w.Term == nil {
		t.Fatal("s's campaign failed")
	}
	notYet(t, gotX, 100*time.Millisecond)
	if err := w.Term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitTerm(t, gotX, 10*time.Second)
}
