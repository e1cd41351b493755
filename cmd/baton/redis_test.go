package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// redisURL starts a redis-server with a password for the test and returns
// a redis:// URL of it that reads the password from a file.
func redisURL(t *testing.T) string {
	srv := testserver.StartRedis(t, testserver.RedisOptions{Password: "s3cret-pw"})
	pw := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(pw, []byte("s3cret-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.ShareWith(t, pw)
	return "redis://" + srv.Addr() + "/0?password_file=" + pw
}

// redisSentinelURL starts a primary, a replica and three sentinels and
// returns a redis+sentinel:// URL of them (baton_replicas defaults to 1:
// every acquisition and renewal waits for the replica).
func redisSentinelURL(t *testing.T) string {
	p := testserver.StartRedis(t, testserver.RedisOptions{})
	r := testserver.StartRedis(t, testserver.RedisOptions{ReplicaOf: p.Addr()})
	testkit.Eventually(t, 30*time.Second, "the replica in sync", func() bool {
		v, _ := r.Do("INFO", "replication")
		s, _ := v.(string)
		return strings.Contains(s, "master_link_status:up")
	})
	s := testserver.StartSentinels(t, p, testserver.SentinelOptions{})
	return "redis+sentinel://" + strings.Join(s.Addrs(), ",") + "/" + s.MasterName
}

// sentinelGroup is a primary, its replica and three sentinels on loopback,
// the replica in sync and known to every sentinel.
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

func (g *sentinelGroup) url(query string) string {
	return "redis+sentinel://" + strings.Join(g.sentinels.Addrs(), ",") + "/" + g.sentinels.MasterName + query
}

// cutReplication stops the replica (SIGSTOP) and has the primary drop its
// link: what the primary takes from now on is lost when it dies. (A
// stopped replica alone still receives: the kernel buffers the stream.)
func (g *sentinelGroup) cutReplication(t *testing.T) {
	t.Helper()
	if err := g.replica.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	g.primary.MustDo(t, "CLIENT", "KILL", "TYPE", "replica")
}

// failOver kills the primary, resumes the replica, waits for every
// sentinel to name it and for it to serve as primary, then starts the old
// primary again (empty: no persistence), which the sentinels make its
// replica.
func (g *sentinelGroup) failOver(t *testing.T) {
	t.Helper()
	g.primary.Kill()
	if err := g.replica.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "every sentinel names the promoted replica", func() bool {
		for _, sp := range g.sentinels.Procs {
			v, err := sp.Do("SENTINEL", "get-master-addr-by-name", g.sentinels.MasterName)
			if a, ok := v.([]any); err != nil || !ok || len(a) != 2 || net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1])) != g.replica.Addr() {
				return false
			}
		}
		// Started before the replica left it, the empty old primary
		// would have the replica copy its empty data.
		v, _ := g.replica.Do("INFO", "replication")
		s, _ := v.(string)
		return strings.Contains(s, "role:master")
	})
	if err := g.primary.Start(); err != nil {
		t.Fatal(err)
	}
}

// leaseSafeUntil reads lease's safe-until from a `baton run --http` at
// addr: zero when it is not held there.
func leaseSafeUntil(t *testing.T, addr, lease string) time.Time {
	t.Helper()
	v, err := getSafeUntil(addr, lease)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// getSafeUntil is leaseSafeUntil, returning its error.
func getSafeUntil(addr, lease string) (time.Time, error) {
	resp, err := http.Get("http://" + addr + "/v1/leases/" + lease)
	if err != nil {
		return time.Time{}, fmt.Errorf("GET /v1/leases/%s: %w", lease, err)
	}
	defer resp.Body.Close()
	var v struct {
		HeldHere  bool       `json:"held_here"`
		SafeUntil *time.Time `json:"safe_until"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return time.Time{}, fmt.Errorf("GET /v1/leases/%s: %w", lease, err)
	}
	if !v.HeldHere || v.SafeUntil == nil {
		return time.Time{}, nil
	}
	return *v.SafeUntil, nil
}

// TestRunSentinelFailoverLosingRenewal is the Sentinel failover attack on
// three `baton run` processes (plain-user processes when the test is
// root), each child writing a heartbeat every 50 ms: the replica stops
// receiving, the holder renews on the primary alone, and is then stopped
// (SIGSTOP of baton alone: it can no longer learn anything) while the
// primary dies and Sentinel promotes the replica, whose copy of the lease
// key expires by the older renewal. The holder's child must stop by the
// safe-until its baton last showed (its guard stops it), before a
// standby's child starts, with a higher token. With baton_replicas=0
// (BATON_TEST_REDIS_REPLICAS=0) the lost renewal counts, and the two
// children act at once. BATON_TEST_REDIS_FAILOVER_RUNS repeats it.
func TestRunSentinelFailoverLosingRenewal(t *testing.T) {
	t.Parallel()
	runs := 1
	if v, _ := strconv.Atoi(os.Getenv("BATON_TEST_REDIS_FAILOVER_RUNS")); v > 0 {
		runs = v
	}
	query := ""
	if v := os.Getenv("BATON_TEST_REDIS_REPLICAS"); v != "" {
		query = "?baton_replicas=" + v
	}
	for i := range runs {
		t.Run(strconv.Itoa(i), func(t *testing.T) { runSentinelFailoverLosingRenewal(t, query) })
	}
}

func runSentinelFailoverLosingRenewal(t *testing.T, query string) {
	const lease = "sentinel-failover"
	g := startSentinelGroup(t)
	file, self := sharedEventFile(t)
	killLeftoverChildren(t, file)
	env := testEnv(childEnv+"=hb", childFileEnv+"="+file)
	var procs []*batonProc
	var https []string
	for i := range 3 {
		addr := freePort(t)
		https = append(https, addr)
		// TTL 6 s: renewals every 2 s, each waiting up to 0.67 s for the
		// replica; the failover (1 s to find the primary down, then an
		// election) is over before a lost renewal's safe-until.
		procs = append(procs, startUnprivilegedBaton(t, fmt.Sprintf("baton-%d", i+1), env,
			"run", "--backend", g.url(query), "--lease", lease, "--ttl", "6s", "--grace", "300ms",
			"--http", addr, "--log-level", "debug", "--", self))
	}
	testkit.Eventually(t, 60*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	holder := leaderProc(t, procs, first.pid)
	holderHTTP := https[slices.Index(procs, holder)]
	testkit.Eventually(t, 30*time.Second, "the holder's API to show its term", func() bool {
		return !leaseSafeUntil(t, holderHTTP, lease).IsZero()
	})

	// The replica stops receiving; then a renewal reaches the primary
	// alone: the key's time to live goes up again.
	g.cutReplication(t)
	key := "baton:lease:" + lease
	pttl := func() int64 { v, _ := g.primary.MustDo(t, "PTTL", key).(int64); return v }
	cutAt := pttl()
	safe := leaseSafeUntil(t, holderHTTP, lease)
	testkit.Eventually(t, 30*time.Second, "a renewal on the primary alone", func() bool { return pttl() > cutAt })
	// Then its outcome: counted (the safe-until moves on) or refused for
	// want of the replica's acknowledgement.
	testkit.Eventually(t, 30*time.Second, "the renewal's outcome", func() bool {
		return leaseSafeUntil(t, holderHTTP, lease).After(safe) || strings.Contains(holder.out.String(), "acknowledged the renewal")
	})
	safe = leaseSafeUntil(t, holderHTTP, lease)
	if err := holder.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = holder.cmd.Process.Signal(syscall.SIGCONT) })

	g.failOver(t)
	var second event
	testkit.Eventually(t, 60*time.Second, "a standby's child to start", func() bool {
		ss := starts(readEvents(file))
		if len(ss) < 2 {
			return false
		}
		second = ss[1]
		return true
	})
	testkit.Eventually(t, 10*time.Second, "the new child's heartbeats", func() bool { return heartbeatsOf(file, second.pid) >= 10 })
	if err := holder.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	var last int64
	for _, e := range readEvents(file) {
		if e.pid == first.pid {
			last = max(last, e.at)
		}
	}
	t.Logf("the holder (token %d) was stopped for %s; its child acted until %s before its safe-until; the next child (token %d) started %s after it",
		first.token, time.Since(stopped).Round(time.Millisecond), safe.Sub(time.Unix(0, last)).Round(time.Millisecond),
		second.token, time.Duration(second.at-last).Round(time.Millisecond))
	// The API shows whole milliseconds, cut short.
	if limit := safe.Add(time.Millisecond); time.Unix(0, last).After(limit) {
		t.Errorf("the old holder's child acted until %s after the safe-until its baton last showed", time.Unix(0, last).Sub(limit))
	}
	if alive(first.pid) {
		t.Errorf("the old holder's child %d still runs beside its successor", first.pid)
	}
	if second.others != 0 {
		t.Errorf("the standby's child started while %d other children were alive", second.others)
	}
	if second.token <= first.token {
		t.Errorf("tokens did not rise across the failover: %d, then %d", first.token, second.token)
	}
	// The resumed holder finds its term over; its child must not come back.
	resumed := time.Now().UnixNano()
	testkit.Eventually(t, 20*time.Second, "a second of heartbeats after the resume", func() bool {
		n := 0
		for _, e := range readEvents(file) {
			if e.kind == "hb" && e.at > resumed {
				n++
			}
		}
		return n >= 20
	})
	checkNoOverlap(t, file)
}

// TestRunSentinelFailoverLosingAcquisition is the Sentinel failover attack
// on an acquisition, with `baton run` processes as in
// TestRunSentinelFailoverLosingRenewal: a first term, replicated, gives the
// lease a token; then the replica stops receiving, a new `baton run`
// acquires the free lease on the primary alone, and is stopped (SIGSTOP of
// baton) while the primary dies and Sentinel promotes the replica, which
// never saw the acquisition. Two more `baton run` start there. No two
// children may act at once, and the tokens of the children that acted
// strictly rise. With baton_replicas=0 (BATON_TEST_REDIS_REPLICAS=0) the
// acquisition counts, its child acts, and the next holder gets the same
// token while it still does. BATON_TEST_REDIS_FAILOVER_RUNS repeats it.
func TestRunSentinelFailoverLosingAcquisition(t *testing.T) {
	t.Parallel()
	runs := 1
	if v, _ := strconv.Atoi(os.Getenv("BATON_TEST_REDIS_FAILOVER_RUNS")); v > 0 {
		runs = v
	}
	query := ""
	if v := os.Getenv("BATON_TEST_REDIS_REPLICAS"); v != "" {
		query = "?baton_replicas=" + v
	}
	for i := range runs {
		t.Run(strconv.Itoa(i), func(t *testing.T) { runSentinelFailoverLosingAcquisition(t, query) })
	}
}

func runSentinelFailoverLosingAcquisition(t *testing.T, query string) {
	const lease = "sentinel-acquisition"
	g := startSentinelGroup(t)
	file, self := sharedEventFile(t)
	killLeftoverChildren(t, file)
	env := testEnv(childEnv+"=hb", childFileEnv+"="+file)
	n := 0
	start := func() (*batonProc, string) {
		n++
		addr := freePort(t)
		return startUnprivilegedBaton(t, fmt.Sprintf("baton-%d", n), env,
			"run", "--backend", g.url(query), "--lease", lease, "--ttl", "6s", "--grace", "300ms",
			"--http", addr, "--log-level", "debug", "--", self), addr
	}
	// A first term, replicated, and released.
	p0, _ := start()
	testkit.Eventually(t, 60*time.Second, "the first child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	testkit.Eventually(t, 10*time.Second, "the first child's heartbeats", func() bool { return heartbeatsOf(file, first.pid) >= 5 })
	if err := p0.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p0.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("the first baton exited %d after SIGTERM, want 0", code)
	}
	key := "baton:lease:" + lease
	testkit.Eventually(t, 30*time.Second, "the release replicated", func() bool {
		v, _ := g.replica.Do("EXISTS", key)
		return v == int64(0)
	})

	// The replica stops receiving; a new baton acquires on the primary
	// alone: counted (its child starts) or refused for want of the
	// replica's acknowledgement.
	g.cutReplication(t)
	a, aHTTP := start()
	testkit.Eventually(t, 30*time.Second, "the acquisition's outcome", func() bool {
		v, err := getSafeUntil(aHTTP, lease) // an error until its API is up
		return (err == nil && !v.IsZero()) || strings.Contains(a.out.String(), "acknowledged the acquisition")
	})
	safe := leaseSafeUntil(t, aHTTP, lease)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	g.failOver(t)
	start()
	start()
	// The children so far: the first term's, and the lost acquisition's
	// if it counted.
	idx := 1
	if !safe.IsZero() {
		idx = 2
	}
	var next event
	testkit.Eventually(t, 60*time.Second, "a child to start after the failover", func() bool {
		ss := starts(readEvents(file))
		if len(ss) <= idx {
			return false
		}
		next = ss[idx]
		return heartbeatsOf(file, next.pid) >= 10
	})
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !safe.IsZero() {
		// The acquisition counted: its child acted, and must have stopped
		// by the safe-until its baton showed.
		lost := starts(readEvents(file))[1]
		var last int64
		for _, e := range readEvents(file) {
			if e.pid == lost.pid {
				last = max(last, e.at)
			}
		}
		if limit := safe.Add(time.Millisecond); time.Unix(0, last).After(limit) {
			t.Errorf("the lost acquisition's child acted until %s after the safe-until its baton last showed", time.Unix(0, last).Sub(limit))
		}
		t.Logf("the lost acquisition (token %d) counted; its child acted until %s before its safe-until", lost.token, safe.Sub(time.Unix(0, last)).Round(time.Millisecond))
	} else {
		t.Logf("the lost acquisition did not count; after the failover, token %d (the first term's: %d)", next.token, first.token)
	}
	if next.others != 0 {
		t.Errorf("a child started after the failover while %d other children were alive", next.others)
	}
	resumed := time.Now().UnixNano()
	testkit.Eventually(t, 20*time.Second, "a second of heartbeats after the resume", func() bool {
		n := 0
		for _, e := range readEvents(file) {
			if e.kind == "hb" && e.at > resumed {
				n++
			}
		}
		return n >= 20
	})
	checkNoOverlap(t, file)
}
