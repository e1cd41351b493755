package redis_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	goredis "github.com/redis/go-redis/v9"
)

// readCounter is a go-redis hook that counts the acquisition scripts a
// client sent and had answered: a waiting process's read of its lease (the
// script that takes a free lease or reports its holder, whose second key
// is the lease's token key).
type readCounter struct{ n atomic.Int64 }

func (r *readCounter) count(cmd goredis.Cmder) {
	a := cmd.Args()
	if len(a) > 4 && strings.EqualFold(fmt.Sprint(a[0]), "evalsha") && strings.HasPrefix(fmt.Sprint(a[4]), redis.DefaultPrefix+"token:") {
		r.n.Add(1)
	}
}

func (r *readCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *readCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		r.count(cmd)
		return err
	}
}

func (r *readCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			r.count(c)
		}
		return err
	}
}

// queueProcess is one process of the queue tests: a Backend on a client
// of its own, through a proxy of its own, counting its reads.
type queueProcess struct {
	b     *redis.Backend
	proxy *testserver.Proxy
	reads *readCounter
}

func newQueueProcess(t *testing.T, srv *testserver.Redis, o redis.Options) *queueProcess {
	t.Helper()
	proxy := testserver.StartProxy(t, srv.Addr())
	c := newClient(t, proxy.Addr(), "")
	rc := &readCounter{}
	c.AddHook(rc)
	b := newBackend(t, c, o)
	testkit.Eventually(t, 30*time.Second, "subscribed", func() bool { return b.Notifications().Listening })
	return &queueProcess{b: b, proxy: proxy, reads: rc}
}

type campaignResult struct {
	who  int
	term baton.Term
	err  error
}

// startQueueServer starts a server whose marker says baton has known it
// for long: a new store grants no lease for a TTL, which queueTiming
// makes long.
func startQueueServer(t *testing.T) *testserver.Redis {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	srv.MustDo(t, "SET", redis.DefaultPrefix+"store", "0 1")
	return srv
}

// queueTiming makes every wake-up by polling or by the holder's key
// expiring take over a minute: what happens within the tests' waits is
// the work of the wake-ups a release sends.
var queueTiming = redis.Options{Config: backend.Config{TTL: 3 * time.Minute}, PollInterval: 10 * time.Minute}

// TestReleaseWakesOneProcess: with many processes waiting for one lease,
// each release or hand-over makes one of them read the lease (the head of
// the queue, which takes it), not every one (a herd).
func TestReleaseWakesOneProcess(t *testing.T) {
	srv := startQueueServer(t)
	const n = 8
	const lease = "herd"
	ps := make([]*queueProcess, n)
	for i := range ps {
		ps[i] = newQueueProcess(t, srv, queueTiming)
	}
	ctx := t.Context()
	holder, err := ps[0].b.Campaign(ctx, lease, baton.Candidate{ID: "p0"})
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan campaignResult, n)
	for i := 1; i < n; i++ {
		go func() {
			term, err := ps[i].b.Campaign(ctx, lease, baton.Candidate{ID: fmt.Sprintf("p%d", i)})
			results <- campaignResult{i, term, err}
		}()
	}
	// Each waiter has read the lease once (and so joined its queue).
	testkit.Eventually(t, 30*time.Second, "every waiter read the lease", func() bool {
		for _, p := range ps[1:] {
			if p.reads.n.Load() == 0 {
				return false
			}
		}
		return true
	})
	before := make([]int64, n)
	for i, p := range ps {
		before[i] = p.reads.n.Load()
	}
	// n-1 hand-overs: each holder resigns, and a waiter takes the lease.
	token := holder.Token()
	for range n - 1 {
		if err := holder.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("p%d: %v", r.who, r.err)
			}
			if r.term.Token() <= token {
				t.Fatalf("p%d took the lease with token %d after token %d", r.who, r.term.Token(), token)
			}
			holder, token = r.term, r.term.Token()
		case <-time.After(time.Minute):
			t.Fatal("no waiter took the released lease within a minute (polling and expiry take longer: the release woke none)")
		}
	}
	var reads int64
	var readers []string
	for i, p := range ps {
		if d := p.reads.n.Load() - before[i]; d > 0 {
			reads += d
			readers = append(readers, fmt.Sprintf("p%d: %d", i, d))
		}
	}
	// One read per hand-over: the woken head's, which takes the lease. A
	// herd reads once per waiting process per release (and again on each
	// acquisition's publish): 7+6+...+1 = 28 reads at the least.
	if max := int64(n - 1); reads > max {
		t.Errorf("%d hand-overs cost %d reads of the lease by waiting processes (%s); want at most %d, one per hand-over", n-1, reads, strings.Join(readers, ", "), max)
	}
	t.Logf("%d hand-overs, %d reads by waiting processes (%s)", n-1, reads, strings.Join(readers, ", "))
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
