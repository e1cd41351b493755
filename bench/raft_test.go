package bench

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testhook"
	"github.com/batonhq/baton/internal/testkit"
	metrics "github.com/hashicorp/go-metrics/compat"
)

func init() { targets = append(targets, namedTarget{"raft", raftTarget}) }

// raftTarget runs against an embedded raft group deployed as in production:
// three voters on loopback with the default raft timings (HeartbeatTimeout
// 1.25 s), mutual TLS and a group secret. The voters stand for the group's
// first three processes. Every simulated process is a member of its own that
// joins as a non-voter, as the fourth and later processes of a group do, and
// campaigns through it; killing a process kills its member (testhook.KillRaftNode: no
// leave, no session destroy), as kill -9 would. A process of this target is
// therefore never the raft leader; BenchmarkCrashFailoverRaftMember measures
// the crash of a holder that is a voter, raft leader or follower.
//
// requests counts the Group calls that the raft leader served for every
// Backend in the test binary (see raftCounter).
//
// The group starts with the first process a benchmark asks for: its
// members run in the benchmark's own process, and a group running beside
// another measurement would add its CPU to that figure.
//
// A TTL below raft.MinTTL at the default heartbeat timeout (2.21 s), such
// as benchCfg's 1 s, is raised to that floor, since raft.New refuses it:
// the raft rows of the failover benchmarks are at TTL 2.21 s.
func raftTarget(b *testing.B) target {
	counts := installRaftCounter(b)
	var (
		mu sync.Mutex
		g  *raftGroup
	)
	floor := raft.MinTTL(0)
	return target{
		name: "raft",
		new: func(b *testing.B, cfg backend.Config) *process {
			mu.Lock()
			if g == nil {
				g = newRaftGroup(b)
				g.startVoters(b, 3)
				b.Cleanup(func() { mu.Lock(); g = nil; mu.Unlock() })
			}
			grp := g
			mu.Unlock()
			if cfg.TTL != 0 && cfg.TTL < floor {
				b.Logf("raft: TTL %s raised to raft.MinTTL, %s", cfg.TTL, floor)
				cfg.TTL = floor
			}
			return grp.process(b, cfg)
		},
		requests: counts.groupCalls,
	}
}

// newRaftTarget is raftTarget on a group started at once, also returning
// its voters.
func newRaftTarget(b *testing.B) (target, []*raft.Node) {
	counts := installRaftCounter(b)
	g := newRaftGroup(b)
	voters := g.startVoters(b, 3)
	return target{
		name:     "raft",
		new:      g.process,
		requests: counts.groupCalls,
	}, voters
}

// process starts a member that joins g as a non-voter and a Backend on it
// with cfg: one process of the raft target.
func (g *raftGroup) process(b *testing.B, cfg backend.Config) *process {
	b.Helper()
	n := g.start(b, raft.NodeOptions{})
	waitJoined(b, n)
	return &process{backend: newRaftBackend(b, n, cfg), kill: func() { _ = testhook.KillRaftNode(n) }}
}

// raftGroup starts the members of one raft group on loopback. It is also
// their Discoverer, listing the voters as a static seed list would.
type raftGroup struct {
	ca     *certs.CA
	secret string

	mu        sync.Mutex
	voters    []string
	logger    *slog.Logger  // the members' Logger; nil for the default
	heartbeat time.Duration // the voters' HeartbeatTimeout; 0 for the default
}

// logBuf collects the log lines of a group's members.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
	at  int // where mark was called
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// mark notes the end of what was logged so far, for since.
func (l *logBuf) mark() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at = l.buf.Len()
}

// since returns what was logged after mark.
func (l *logBuf) since() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()[l.at:]
}

func newRaftGroup(b *testing.B) *raftGroup {
	b.Helper()
	ca, err := certs.NewCA("baton bench CA", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	return &raftGroup{ca: ca, secret: "0123456789abcdef-bench-secret"}
}

// Peers implements raft.Discoverer.
func (g *raftGroup) Peers(context.Context) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.voters), nil
}

// startVoters starts n members that bootstrap a new group of n voters, and
// waits until all of them are in it.
func (g *raftGroup) startVoters(b *testing.B, n int) []*raft.Node {
	b.Helper()
	nodes := make([]*raft.Node, n)
	for i := range nodes {
		nodes[i] = g.start(b, raft.NodeOptions{BootstrapExpect: n, Voters: n, HeartbeatTimeout: g.heartbeat})
		g.mu.Lock()
		g.voters = append(g.voters, nodes[i].Addr())
		g.mu.Unlock()
	}
	waitJoined(b, nodes...)
	return nodes
}

// start starts a member with opts and the group's address, TLS, secret and
// discovery; every timing is left at its default. b's cleanup closes the
// member, which leaves the group as an exiting process does.
func (g *raftGroup) start(b *testing.B, opts raft.NodeOptions) *raft.Node {
	b.Helper()
	tlsCfg, err := g.ca.Config("member", []string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	opts.BindAddr, opts.TLS, opts.Secret, opts.Discovery = "127.0.0.1:0", tlsCfg, g.secret, g
	opts.Logger = g.logger
	n, err := raft.StartNode(opts)
	if err != nil {
		b.Fatalf("StartNode: %v", err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

func waitJoined(b *testing.B, nodes ...*raft.Node) {
	b.Helper()
	for _, n := range nodes {
		select {
		case <-n.Joined():
		case <-time.After(30 * time.Second):
			b.Fatalf("member %s did not join: %+v", n.ID(), n.Status())
		}
	}
}

// newRaftBackend returns a Backend on n that b's cleanup closes (before n,
// as cleanups run last-in first-out).
func newRaftBackend(b *testing.B, n *raft.Node, cfg backend.Config) *raft.Backend {
	b.Helper()
	be, err := raft.New(n, raft.Options{Config: cfg})
	if err != nil {
		b.Fatal(err)
	}
	return testkit.CloseAtEnd(b, be, 2*time.Second)
}

// raftCounter counts what hashicorp/raft reports through go-metrics, the
// only place where backend/raft's traffic can be counted from outside: its
// Group methods are unexported and its group API is HTTP inside mutual TLS.
// backend/raft serves every Group call of a Backend on the raft leader with
// exactly one raft call: a command (acquire, release, dequeue, session
// create or destroy) with one Apply, a renewal or a linearizable read with one
// VerifyLeader, whether the call came from a process on the leader or was
// forwarded by another member. The leader's own session-expire commands are
// Applies too, but none happen in a steady state. The count breaks silently
// if backend/raft stops calling VerifyLeader per renewal.
//
// go-metrics is global, so the counts cover every raft member in the test
// binary; benchmarks run one group at a time.
type raftCounter struct {
	apply, verifyLeader atomic.Int64
	// appendEntries counts the AppendEntries RPCs that followers handled,
	// heartbeats included; heartbeats counts those alone.
	appendEntries, heartbeats atomic.Int64
}

var (
	raftCounterOnce sync.Once
	theRaftCounter  = &raftCounter{}
	raftCounterErr  error

	keyApply         = []string{"raft", "apply"}
	keyVerifyLeader  = []string{"raft", "verify_leader"}
	keyAppendEntries = []string{"raft", "rpc", "appendEntries"}
	keyHeartbeat     = []string{"raft", "rpc", "processHeartbeat"}
)

var _ metrics.MetricSink = (*raftCounter)(nil)

// installRaftCounter makes the counter go-metrics' global sink, once.
func installRaftCounter(b *testing.B) *raftCounter {
	b.Helper()
	raftCounterOnce.Do(func() {
		conf := metrics.DefaultConfig("")
		conf.EnableHostname = false
		conf.EnableRuntimeMetrics = false // it starts a goroutine that never ends
		_, raftCounterErr = metrics.NewGlobal(conf, theRaftCounter)
	})
	if raftCounterErr != nil {
		b.Fatal(raftCounterErr)
	}
	return theRaftCounter
}

// groupCalls is the number of Group calls served so far.
func (c *raftCounter) groupCalls() int64 { return c.apply.Load() + c.verifyLeader.Load() }

func (c *raftCounter) IncrCounter(key []string, val float32) { c.IncrCounterWithLabels(key, val, nil) }

func (c *raftCounter) IncrCounterWithLabels(key []string, val float32, _ []metrics.Label) {
	switch {
	case slices.Equal(key, keyApply):
		c.apply.Add(int64(val))
	case slices.Equal(key, keyVerifyLeader):
		c.verifyLeader.Add(int64(val))
	}
}

func (c *raftCounter) AddSample(key []string, val float32) { c.AddSampleWithLabels(key, val, nil) }

func (c *raftCounter) AddSampleWithLabels(key []string, _ float32, _ []metrics.Label) {
	switch {
	case slices.Equal(key, keyAppendEntries):
		c.appendEntries.Add(1)
	case slices.Equal(key, keyHeartbeat):
		c.heartbeats.Add(1)
	}
}

func (c *raftCounter) SetGauge([]string, float32)                            {}
func (c *raftCounter) SetGaugeWithLabels([]string, float32, []metrics.Label) {}
func (c *raftCounter) EmitKey([]string, float32)                             {}

// BenchmarkCrashFailoverRaftMember: the holder's process is one of the
// group's three voters, as in a group of three `baton run --backend
// raft://` processes (or `baton demo`): the holder and two standbys that
// run Electors. The holder's member is killed (no leave, no session
// destroy, as kill -9) right after the holder renewed; failover is the time
// until a standby leads. Each iteration starts a new group, since the crash
// leaves two voters until autopilot replaces the third.
//
// follower: the holder's member is a raft follower: the raft leader expires
// the holder's session a TTL after its last renewal. leader: it is also the
// raft leader: the survivors notice the silence after one to three
// HeartbeatTimeouts (1.25 s by default), elect a leader, and that leader times the
// sessions from the last moment a quorum of voters heard from the old one
// plus half a HeartbeatTimeout, so the election overlaps the TTL instead
// of preceding it. raft-election is the time until a survivor reports
// itself raft leader. others-lost-frac is the share of the survivors' own
// terms (each holds a lease of its own) that had ended by the failover: no
// renewal is confirmed during a raft election, so one that outlasts a
// holder's renewal window ends its term at safe-until. With -v, each
// iteration logs its figures, and the members' log when it took longer
// than TTL + one renew interval.
//
// default leaves every setting at its default (TTL raft.DefaultTTL, 5 s,
// heartbeat timeout raft.DefaultHeartbeatTimeout, 1.25 s);
// ht=500ms,ttl=2s is a faster group, for comparison: it fails over sooner
// and loses terms on a busy host (BenchmarkRaftUnderLoad).
func BenchmarkCrashFailoverRaftMember(b *testing.B) {
	for _, ttl := range []struct {
		name string
		cfg  backend.Config
		ht   time.Duration
	}{{"default", backend.Config{}, 0}, {"ht=500ms,ttl=2s", backend.Config{TTL: 2 * time.Second}, 500 * time.Millisecond}} {
		for _, leader := range []bool{false, true} {
			role := map[bool]string{false: "follower", true: "leader"}[leader]
			b.Run(role+"/"+ttl.name, func(b *testing.B) {
				var failovers, elections []time.Duration
				lost := 0
				for i := 0; b.Loop(); i++ {
					f, e, l := raftMemberCrash(b, fmt.Sprintf("member-crash-%s-%d-%d", role, time.Now().UnixNano(), i), ttl.cfg, ttl.ht, leader)
					failovers = append(failovers, f)
					lost += l
					if leader {
						elections = append(elections, e)
					}
				}
				report(b, failovers, "failover")
				if leader {
					report(b, elections, "raft-election")
				}
				b.ReportMetric(float64(lost)/float64(2*len(failovers)), "others-lost-frac")
			})
		}
	}
}

// raftMemberCrash runs one iteration of BenchmarkCrashFailoverRaftMember on
// a new group, measured as handOver measures: from the kill, right after
// the holder renewed, until a standby leads. election is the time until a
// survivor is raft leader (when the raft leader was killed).
func raftMemberCrash(b *testing.B, lease string, cfg backend.Config, heartbeat time.Duration, crashLeader bool) (failover, election time.Duration, othersLost int) {
	b.Helper()
	g := newRaftGroup(b)
	g.heartbeat = heartbeat
	// The members' log, shown for an iteration slower than the bound.
	diag := &logBuf{}
	g.logger = slog.New(slog.NewTextHandler(diag, nil))
	nodes := g.startVoters(b, 3)
	leader := waitRaftLeader(b, nodes)
	victim := leader
	if !crashLeader {
		victim = slices.DeleteFunc(slices.Clone(nodes), func(n *raft.Node) bool { return n == leader })[0]
	}
	var survivors []*raft.Node
	for _, n := range nodes {
		if n != victim {
			survivors = append(survivors, n)
		}
	}
	// Every member holds a lease, the raft leader's last: otherwise a raft
	// leader that holds one hands raft leadership to a member that holds
	// none (a member never both leads the group and holds a lease when it
	// can help it), and the benchmark would not measure the case it is
	// named for.
	var (
		holder   *raft.Backend
		th       baton.Term
		standbys []*raft.Backend
		ballast  []baton.Term // the survivors' own leases
	)
	order := append(slices.DeleteFunc(slices.Clone(nodes), func(n *raft.Node) bool { return n == leader }), leader)
	for i, n := range order {
		be := newRaftBackend(b, n, cfg)
		if n == victim {
			holder, th = be, mustCampaign(b, &process{backend: be}, lease, "holder")
			continue
		}
		standbys = append(standbys, be)
		ballast = append(ballast, mustCampaign(b, &process{backend: be}, fmt.Sprintf("%s-ballast-%d", lease, i), fmt.Sprintf("ballast-%d", i)))
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	got := make(chan time.Time, 1)
	backends := append([]*raft.Backend{holder}, standbys...)
	for i, be := range standbys {
		e, err := baton.NewElector(be, baton.ElectorConfig{Lease: lease, Candidate: baton.Candidate{ID: fmt.Sprintf("standby-%d", i)}})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			_ = e.Run(ctx, func(ctx context.Context, _ baton.Term) error {
				select {
				case got <- time.Now():
				default: // the other standby was first
				}
				<-ctx.Done()
				return nil
			})
		})
	}
	// Let the standbys queue up and the holder renew once.
	first := th.SafeUntil()
	for !th.SafeUntil().After(first) {
		time.Sleep(5 * time.Millisecond)
	}
	if crashLeader != (victim.Status().State == "Leader") {
		b.Fatalf("raft leadership moved before the crash: the holder's member is %s", victim.Status().State)
	}
	start := time.Now()
	diag.mark()
	_ = testhook.KillRaftNode(victim)
	defer func() {
		if crashLeader {
			b.Logf("failover %v, raft election %v, survivors' terms lost %d of %d", failover.Round(time.Millisecond), election.Round(time.Millisecond), othersLost, len(ballast))
		} else {
			b.Logf("failover %v, survivors' terms lost %d of %d", failover.Round(time.Millisecond), othersLost, len(ballast))
		}
		c := cfg
		if c.TTL == 0 {
			c.TTL = raft.DefaultTTL
		}
		if c, err := c.WithDefaults(); err == nil && failover > c.TTL+c.RenewInterval {
			b.Logf("slower than TTL + one renew interval (%s); the members' log since the kill:\n%s", c.TTL+c.RenewInterval, diag.since())
		}
	}()

	elected := make(chan time.Time, 1)
	if crashLeader {
		go func() {
			for ctx.Err() == nil {
				for _, n := range survivors {
					if n.Status().State == "Leader" {
						elected <- time.Now()
						return
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	select {
	case at := <-got:
		failover = at.Sub(start)
	case <-time.After(time.Minute):
		b.Fatalf("no standby leads a minute after the crash: %+v", survivors[0].Status())
	}
	if crashLeader {
		select {
		case at := <-elected:
			election = at.Sub(start)
		case <-time.After(time.Minute):
			b.Fatal("no raft leader a minute after the crash")
		}
	}
	// By the failover, every survivor's safe-until of before the crash has
	// passed: a term still alive was renewed through the new raft leader.
	for _, t := range ballast {
		if t.Err() != nil {
			othersLost++
		}
	}

	// The group goes with the iteration: kill it rather than leave it, since
	// a member leaving a group of two voters, one of them dead, waits for a
	// quorum that never comes.
	cancel()
	wg.Wait()
	for _, be := range backends {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = be.Close(cctx)
		ccancel()
	}
	for _, n := range survivors {
		_ = testhook.KillRaftNode(n)
	}
	return failover, election, othersLost
}

// waitRaftLeader returns the member of nodes that is raft leader.
func waitRaftLeader(b *testing.B, nodes []*raft.Node) *raft.Node {
	b.Helper()
	var leader *raft.Node
	testkit.Eventually(b, 30*time.Second, "a raft leader", func() bool {
		for _, n := range nodes {
			if n.Status().State == "Leader" {
				leader = n
				return true
			}
		}
		return false
	})
	return leader
}

// BenchmarkSteadyStateRaftTraffic: the raft group's own traffic in
// BenchmarkSteadyState's setup (a holder and a standby, TTL 10 s, members
// of a group of three voters), which req/s/process does not show: the
// AppendEntries RPCs each follower handles per second (heartbeats, every
// HeartbeatTimeout/10 to 2x that, and the leader's commit-index updates,
// every CommitTimeout (50 ms) to 2x that), and the log entries applied per
// second (renewals are not log entries). Not counted either: the raft
// leader's autopilot asks every member for its state over the group API
// once per HeartbeatTimeout (1.25 s).
func BenchmarkSteadyStateRaftTraffic(b *testing.B) {
	tg, voters := newRaftTarget(b)
	counts := installRaftCounter(b)
	cfg := backend.Config{TTL: 10 * time.Second} // the other targets' default
	lease := fmt.Sprintf("steady-traffic-%d", time.Now().UnixNano())
	holder := tg.new(b, cfg)
	th := mustCampaign(b, holder, lease, "holder")
	waiter := tg.new(b, cfg)
	_, last := appliedRange(voters)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = waiter.backend.Campaign(ctx, lease, baton.Candidate{ID: "waiter"}) })
	// Start the window once the standby's session and queue place (two
	// commands) are in every voter's log, so that it holds renewals only.
	for low, _ := appliedRange(voters); low < last+2; low, _ = appliedRange(voters) {
		time.Sleep(10 * time.Millisecond)
	}
	followers := len(voters) + 2 - 1 // the voters and both processes, but the leader
	window := benchci.Size(10*time.Second, time.Second)
	var rpcs, beats, entries float64
	for b.Loop() {
		rpc0, beat0, applied0, start := counts.appendEntries.Load(), counts.heartbeats.Load(), voters[0].Status().Applied, time.Now()
		time.Sleep(window) // the measurement window itself, not synchronisation
		secs := time.Since(start).Seconds()
		rpcs = float64(counts.appendEntries.Load()-rpc0) / secs / float64(followers)
		beats = float64(counts.heartbeats.Load()-beat0) / secs / float64(followers)
		entries = float64(voters[0].Status().Applied-applied0) / secs
	}
	b.ReportMetric(rpcs, "append-rpc/s/follower")
	b.ReportMetric(beats, "heartbeat-rpc/s/follower")
	b.ReportMetric(entries, "log-entries/s")
	cancel()
	wg.Wait()
	_ = th.Resign(context.Background())
}

// appliedRange returns the lowest and the highest log index that members
// of nodes have applied.
func appliedRange(nodes []*raft.Node) (low, high uint64) {
	for i, n := range nodes {
		a := n.Status().Applied
		if i == 0 || a < low {
			low = a
		}
		high = max(high, a)
	}
	return low, high
}
