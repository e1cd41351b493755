package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	goredis "github.com/redis/go-redis/v9"
)

// cutDialer dials for one simulated process and can partition it: Cut
// closes every connection it made and fails every later dial, as a
// network partition would (all of the process's connections: to the
// primary, the replicas and the sentinels).
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

var errPartitioned = errors.New("partitioned")

func (d *cutDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errPartitioned
	}
	c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cutDialer) Cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// sentinelGroup is a primary, its replica and three sentinels on loopback.
type sentinelGroup struct {
	primary, replica *testserver.Redis
	sentinels        *testserver.Sentinels
}

func startSentinelGroup(t *testing.T) *sentinelGroup {
	t.Helper()
	p := testserver.StartRedis(t, testserver.RedisOptions{})
	r := testserver.StartRedis(t, testserver.RedisOptions{ReplicaOf: p.Addr()})
	testkit.Eventually(t, 30*time.Second, "the replica in sync", func() bool {
		v, _ := r.Do("INFO", "replication")
		s, _ := v.(string)
		return strings.Contains(s, "master_link_status:up")
	})
	s := testserver.StartSentinels(t, p, testserver.SentinelOptions{})
	testkit.Eventually(t, 60*time.Second, "the sentinels know the replica and each other", func() bool {
		for _, sp := range s.Procs {
			reps, err := sp.Do("SENTINEL", "replicas", s.MasterName)
			if a, ok := reps.([]any); err != nil || !ok || len(a) != 1 {
				return false
			}
			others, err := sp.Do("SENTINEL", "sentinels", s.MasterName)
			if a, ok := others.([]any); err != nil || !ok || len(a) != len(s.Procs)-1 {
				return false
			}
		}
		return true
	})
	return &sentinelGroup{primary: p, replica: r, sentinels: s}
}

// cutReplication stops the replica (SIGSTOP) and has the primary drop
// its link: what the primary takes from now on stays in its backlog, and
// is lost when it dies. (A stopped replica alone still receives: the
// kernel buffers the replication stream until it resumes.)
func (g *sentinelGroup) cutReplication(t *testing.T) {
	t.Helper()
	if err := g.replica.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	g.primary.MustDo(t, "CLIENT", "KILL", "TYPE", "replica")
}

// afterFailover waits for the sentinels to promote the replica, and
// restarts the old primary, which they turn into its replica: with
// Options.Replicas = 1, the new primary takes writes only once it has one.
func (g *sentinelGroup) afterFailover(t *testing.T) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, "every sentinel names the promoted replica", func() bool {
		for _, sp := range g.sentinels.Procs {
			v, err := sp.Do("SENTINEL", "get-master-addr-by-name", g.sentinels.MasterName)
			if a, ok := v.([]any); err != nil || !ok || len(a) != 2 || net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1])) != g.replica.Addr() {
				return false
			}
		}
		// The sentinels name the replica from the moment they choose it;
		// restarting the old primary (empty, with no persistence) before
		// the replica left it would make the replica copy its empty data.
		v, _ := g.replica.Do("INFO", "replication")
		s, _ := v.(string)
		return strings.Contains(s, "role:master")
	})
	if err := g.primary.Restart(); err != nil {
		t.Fatal(err)
	}
}

// process is one simulated baton process on the Sentinel group.
type process struct {
	b    *redis.Backend
	dial *cutDialer
}

func (g *sentinelGroup) process(t *testing.T, o redis.Options) *process {
	d := &cutDialer{}
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName: g.sentinels.MasterName, SentinelAddrs: g.sentinels.Addrs(),
		Dialer: d.Dial, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return &process{b: newBackend(t, c, o), dial: d}
}

// failoverRuns is how many times each failover test runs in a row: 1, or
// BATON_TEST_REDIS_FAILOVER_RUNS.
func failoverRuns() int {
	if v, _ := strconv.Atoi(os.Getenv("BATON_TEST_REDIS_FAILOVER_RUNS")); v > 0 {
		return v
	}
	return 1
}

// failoverReplicas is Options.Replicas in the failover tests: 1, the
// protection. BATON_TEST_REDIS_REPLICAS=0 runs them without it, to see
// them fail.
func failoverReplicas(t *testing.T) int {
	if v := os.Getenv("BATON_TEST_REDIS_REPLICAS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return 1
}

// campaignThrough campaigns for lease until it wins, through the
// failover's unavailability, as an Elector does.
func campaignThrough(t *testing.T, b *redis.Backend, lease, id string) baton.Term {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		term, err := b.Campaign(context.Background(), lease, baton.Candidate{ID: id})
		if err == nil {
			return term
		}
		if !errors.Is(err, baton.ErrBackendUnavailable) || time.Now().After(deadline) {
			t.Fatalf("campaign of %s: %v", id, err)
		}
		time.Sleep(100 * time.Millisecond) // an Elector's back-off between campaigns
	}
}

// interval is when a holder acted: from the term's start to its end.
type interval struct {
	who        string
	token      uint64
	start, end time.Time
}

// hold records a term as acting from now until it ends.
func hold(who string, term baton.Term) (start time.Time, ended <-chan interval) {
	start = time.Now()
	ch := make(chan interval, 1)
	go func() {
		<-term.Done()
		ch <- interval{who: who, token: term.Token(), start: start, end: time.Now()}
	}()
	return start, ch
}

// TestSentinelFailoverLosingRenewal: the holder's renewal reaches the
// primary but not the replica (paused), the holder is partitioned away
// with the old primary, and Sentinel promotes the replica, whose copy of
// the lease key expires by the older renewal. The contender must not
// start before the holder stopped, and its token must be higher. With
// Options.Replicas = 0 the renewal counts though the replica never got
// it, and the two overlap.
func TestSentinelFailoverLosingRenewal(t *testing.T) {
	for i := range failoverRuns() {
		t.Run(fmt.Sprint(i), func(t *testing.T) { failoverLosingRenewal(t) })
	}
}

func failoverLosingRenewal(t *testing.T) {
	g := startSentinelGroup(t)
	o := redis.Options{
		Config:   backend.Config{TTL: 12 * time.Second, RenewInterval: 4 * time.Second},
		Replicas: failoverReplicas(t), ReplicaTimeout: 500 * time.Millisecond,
	}
	a, b := g.process(t, o), g.process(t, o)
	ctx := context.Background()
	const lease = "failover-renewal"
	ta, err := a.b.Campaign(ctx, lease, baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	_, aEnded := hold("a", ta)
	// A renewal that reached both, then the replica stops.
	before := ta.SafeUntil()
	testkit.Eventually(t, 30*time.Second, "a renewal", func() bool { return ta.SafeUntil().After(before) })
	g.cutReplication(t)
	g.primary.MustDo(t, "CONFIG", "RESETSTAT")
	// The next renewal reaches the primary alone.
	testkit.Eventually(t, 30*time.Second, "a renewal sent to the primary", func() bool {
		return commandStats(t, g.primary)["evalsha"] >= 1
	})
	testkit.Eventually(t, 30*time.Second, "the renewal's WAIT over", func() bool {
		st := commandStats(t, g.primary)
		return o.Replicas == 0 || st["wait"] >= 1
	})
	// The holder is cut off with the old primary, which dies; the replica
	// comes back and is promoted.
	a.dial.Cut()
	g.primary.Kill()
	if err := g.replica.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	g.afterFailover(t)
	tb := campaignThrough(t, b.b, lease, "b")
	bStart, _ := hold("b", tb)
	var ai interval
	select {
	case ai = <-aEnded:
	case <-time.After(2 * o.TTL):
		t.Fatal("the cut-off holder did not stop within two TTLs")
	}
	if bStart.Before(ai.end) {
		t.Errorf("two holders at once: b (token %d) started %s before a (token %d) stopped", tb.Token(), ai.end.Sub(bStart), ai.token)
	}
	if tb.Token() <= ai.token {
		t.Errorf("tokens did not rise across the failover: a %d, then b %d", ai.token, tb.Token())
	}
	t.Logf("a (token %d) stopped %s before b (token %d) started", ai.token, bStart.Sub(ai.end), tb.Token())
}

// TestSentinelFailoverLosingAcquisition: the replica is paused, a holder
// acquires the free lease on the primary alone, and is partitioned away
// with it; Sentinel promotes the replica, which never saw the
// acquisition. With Options.Replicas = 1 the acquisition never counted, so
// the holder never acted; without it, the holder acted, and the next
// holder gets the same token while it still acts.
func TestSentinelFailoverLosingAcquisition(t *testing.T) {
	for i := range failoverRuns() {
		t.Run(fmt.Sprint(i), func(t *testing.T) { failoverLosingAcquisition(t) })
	}
}

func failoverLosingAcquisition(t *testing.T) {
	g := startSentinelGroup(t)
	o := redis.Options{
		Config:   backend.Config{TTL: 12 * time.Second, RenewInterval: 4 * time.Second},
		Replicas: failoverReplicas(t), ReplicaTimeout: 500 * time.Millisecond,
	}
	a, b := g.process(t, o), g.process(t, o)
	ctx := context.Background()
	const lease = "failover-acquisition"
	// An earlier term, replicated, so that the lease has a token.
	t0, err := b.b.Campaign(ctx, lease, baton.Candidate{ID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	first := t0.Token()
	if err := t0.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the release replicated", func() bool {
		v, _ := g.replica.Do("EXISTS", redis.KeysOf("", lease).Lease)
		return v == int64(0)
	})
	g.cutReplication(t)
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	ta, aerr := a.b.Campaign(actx, lease, baton.Candidate{ID: "a"})
	cancel()
	var aEnded <-chan interval
	if aerr == nil {
		_, aEnded = hold("a", ta)
	} else {
		t.Logf("a's acquisition did not count: %v", aerr)
	}
	a.dial.Cut()
	g.primary.Kill()
	if err := g.replica.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	g.afterFailover(t)
	tb := campaignThrough(t, b.b, lease, "b")
	bStart, _ := hold("b", tb)
	if aerr == nil {
		ai := <-aEnded
		if bStart.Before(ai.end) {
			t.Errorf("two holders at once: b (token %d) started %s before a (token %d) stopped", tb.Token(), ai.end.Sub(bStart), ai.token)
		}
		if tb.Token() <= ai.token {
			t.Errorf("tokens did not rise across the failover: a %d, then b %d", ai.token, tb.Token())
		}
	}
	if tb.Token() <= first {
		t.Errorf("tokens did not rise: %d, then %d", first, tb.Token())
	}
}
