package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testkit"
	goredis "github.com/redis/go-redis/v9"
)

// TestReleaseGrantsQueueHead: a release hands the free lease to the
// process at the head of the queue with the next token, so the head holds
// it as it hears of it: its campaign sends no acquisition script after the
// release.
func TestReleaseGrantsQueueHead(t *testing.T) {
	srv := startQueueServer(t)
	const lease = "grant"
	granting := queueTiming
	granting.Grant = true
	a, head := newQueueProcess(t, srv, queueTiming), newQueueProcess(t, srv, granting)
	ctx := t.Context()
	holder, err := a.b.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	results := campaignLater(ctx, head.b, lease, "head")
	queued(t, srv, lease, 1)
	reads := head.reads.n.Load()
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := headsTerm(t, results)
	if got := head.reads.n.Load() - reads; got != 0 {
		t.Fatalf("the head sent %d acquisition scripts after the release: want 0, the release grants it the lease", got)
	}
	if r.term.Token() <= holder.Token() {
		t.Fatalf("granted token %d after %d", r.term.Token(), holder.Token())
	}
	v, err := srv.Do("GET", redis.KeysOf("", lease).Lease)
	if err != nil || !strings.HasPrefix(fmt.Sprint(v), "baton "+strconv.FormatUint(r.term.Token(), 10)+" ") || !strings.HasSuffix(fmt.Sprint(v), " head") {
		t.Fatalf("lease key %v (err %v), want the head's term at token %d", v, err, r.term.Token())
	}
	// The head's own renewal confirms the grant: its term then runs a full
	// TTL from that renewal.
	testkit.Eventually(t, 30*time.Second, "the grant confirmed", func() bool {
		return time.Until(r.term.SafeUntil()) > queueTiming.Config.TTL/2
	})
	if err := r.term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// slowPubSub is a go-redis Dialer whose connections, once one has sent a
// SUBSCRIBE, deliver what they read delay late while delay is set: the
// process hears its pub/sub messages late, while its commands and their
// replies pass at once.
type slowPubSub struct {
	delay atomic.Int64 // nanoseconds
}

func (s *slowPubSub) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, s: s}, nil
}

type slowConn struct {
	net.Conn
	s      *slowPubSub
	pubsub atomic.Bool
}

func (c *slowConn) Write(p []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(p), []byte("subscribe")) {
		c.pubsub.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *slowConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if d := time.Duration(c.s.delay.Load()); d > 0 && n > 0 && c.pubsub.Load() {
		time.Sleep(d) // the message is in flight this long
	}
	return n, err
}

// TestGrantSafeUntilWithinGrantedKey: the head hears its grant late (its
// pub/sub link is slow), and its renewals of the granted key fail. The
// term's safe-until must never pass the granted key's expiry on the
// server: it is counted from the send of the queue entry's refresh that
// the grant copied, which preceded the grant, not from when the grant was
// heard (which would give hearing + TTL - DriftMargin, past the key's
// expiry when the grant took longer than DriftMargin to arrive).
func TestGrantSafeUntilWithinGrantedKey(t *testing.T) {
	srv := startQueueServer(t)
	const lease = "late-grant"
	const ttl = 2 * time.Second
	const late = 6 * ttl / 10 // above DriftMargin (TTL/10) + RenewInterval (TTL/3)
	timing := redis.Options{Config: backend.Config{TTL: ttl}, PollInterval: 10 * time.Minute, Grant: true}
	a := newQueueProcess(t, srv, timing)

	slow := &slowPubSub{}
	c := goredis.NewClient(&goredis.Options{
		Addr: srv.Addr(), ContextTimeoutEnabled: true, DialTimeout: 2 * time.Second, MaxRetries: -1,
		Dialer: slow.dial,
	})
	t.Cleanup(func() { _ = c.Close() })
	blocker := &scriptBlocker{}
	c.AddHook(blocker)
	head := newBackend(t, c, timing)
	testkit.Eventually(t, 30*time.Second, "subscribed", func() bool { return head.Notifications().Listening })

	ctx := t.Context()
	holder, err := a.b.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	results := campaignLater(ctx, head, lease, "head")
	queued(t, srv, lease, 1)
	blocker.on.Store(true) // the head's renewals fail: the granted key keeps its first expiry
	slow.delay.Store(int64(late))
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := headsTerm(t, results)
	safe := r.term.SafeUntil()
	sent := time.Now()
	pttl, err := srv.Do("PTTL", redis.KeysOf("", lease).Lease)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := pttl.(int64)
	if ms <= 0 {
		t.Fatalf("the lease key is gone (PTTL %d) while the term is live until %s from now", ms, time.Until(safe).Round(time.Millisecond))
	}
	// The server read the expiry after sent: the key lives at least until
	// sent + PTTL on this clock.
	if expiry := sent.Add(time.Duration(ms) * time.Millisecond); safe.After(expiry) {
		t.Fatalf("the term (token %d) is safe until %s after its key expires on the server: another process can take the lease while it acts",
			r.term.Token(), safe.Sub(expiry).Round(time.Millisecond))
	}
	select {
	case <-r.term.Done():
	case <-time.After(time.Minute):
		t.Fatal("the granted term, its renewals failing, outlived its safe-until")
	}
}

// campaignLater campaigns for lease as id on b in the background; the
// result comes on the channel.
func campaignLater(ctx context.Context, b baton.Backend, lease, id string) <-chan campaignResult {
	results := make(chan campaignResult, 1)
	go func() {
		term, err := b.Campaign(ctx, lease, baton.Candidate{ID: id})
		results <- campaignResult{1, term, err}
	}()
	return results
}

// headsTerm waits up to a minute for the queue head's campaign to win the
// released lease.
func headsTerm(t *testing.T, results <-chan campaignResult) campaignResult {
	t.Helper()
	select {
	case r := <-results:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r
	case <-time.After(time.Minute):
		t.Fatal("the head did not take the released lease within a minute")
		return campaignResult{}
	}
}
