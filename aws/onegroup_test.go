package aws

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testkit"
)

// bootstrapCounter is a slog.Handler that counts the raft members'
// "bootstrapped a new group" lines (each is a group formed) and their
// rounds of looking for a group, by member, and passes every record on to
// the test's log when BATON_TEST_LOG is set.
type bootstrapCounter struct {
	mu         sync.Mutex
	bootstraps []string
	rounds     map[string]int
	next       slog.Handler
}

type countingHandler struct {
	c      *bootstrapCounter
	member string
	next   slog.Handler
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.c.mu.Lock()
	switch r.Message {
	case "bootstrapped a new group":
		h.c.bootstraps = append(h.c.bootstraps, h.member)
	case "not in a group yet":
		h.c.rounds[h.member]++
	}
	h.c.mu.Unlock()
	if h.next != nil && h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}
func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithAttrs(as)
	}
	return h
}
func (h countingHandler) WithGroup(name string) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithGroup(name)
	}
	return h
}

func (c *bootstrapCounter) logger(t *testing.T, member string) *slog.Logger {
	var next slog.Handler
	if os.Getenv("BATON_TEST_LOG") != "" {
		next = slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}).WithAttrs([]slog.Attr{slog.String("member", member)})
	}
	return slog.New(countingHandler{c: c, member: member, next: next})
}

func (c *bootstrapCounter) roundsOf(member string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rounds[member]
}

func (c *bootstrapCounter) formed() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.bootstraps)
}

// TestOneGroupPerAutoScalingGroup attacks `--bootstrap-expect auto` with
// real raft members on the real ASG discovery against the fake AWS: the
// instances of an Auto Scaling group launch one by one while its desired
// capacity grows, and the members' cached views of the group differ.
//
// Instances a, b, c (desired capacity 3) are InService; a's member starts
// first, with a cache that lives ten minutes, so that its view stays
// {a, b, c}, and waits for b and c. The capacity grows to 4 and d
// launches, with an ID below a's, and d's member starts with a fresh view
// of all four. Then b's member starts, and c's once d has had a round with
// b. By the rule "the seen member with the lowest ID of the first
// bootstrap-expect bootstraps", d bootstraps {d, a, b}, and a, which does
// not see d and whose peers b and c have no log until the raft election
// of d's group reaches them (a heartbeat timeout or more), bootstraps {a,
// b, c}: two groups, whose majorities {d, a} and {b, c} share nobody, so
// two raft leaders in one Auto Scaling group. The oldest instance alone bootstraps, with the oldest three, and
// every member ends in that one group: exactly one "bootstrapped a new
// group" among the members, one configuration and one raft leader for all.
func TestOneGroupPerAutoScalingGroup(t *testing.T) {
	t.Parallel()
	c := newOneGroupCluster(t, "91")
	c.f.SetDesired("web", 3)
	for _, name := range []string{"a", "b", "c"} {
		c.f.Launch(c.ids[name], "web", "InService", "Healthy", c.ips[name])
	}
	c.start("a", 10*time.Minute)
	testkit.Eventually(t, 30*time.Second, "a looking for b and c", func() bool { return c.counter.roundsOf("a") >= 2 })

	c.f.SetDesired("web", 4)
	c.f.Launch(c.ids["d"], "web", "Pending", "Healthy", c.ips["d"])
	c.f.Set(c.ids["d"], func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	c.start("d", time.Second)
	testkit.Eventually(t, 30*time.Second, "d looking for a group", func() bool { return c.counter.roundsOf("d") >= 2 })
	// b first: d has the three it bootstraps with by its rule (d, a, b),
	// a not yet; c as soon as d has bootstrapped (or looked twice more),
	// while the raft election of d's group has not reached a and b.
	dRounds := c.counter.roundsOf("d")
	c.start("b", time.Second)
	testkit.Eventually(t, 30*time.Second, "d bootstrapping, or looking again", func() bool {
		return len(c.counter.formed()) > 0 || c.counter.roundsOf("d") >= dRounds+2
	})
	c.start("c", time.Second)
	c.checkOneGroup("a", 4)
}

// TestOneGroupWhenAnOlderInstanceTurnsInServiceLate: the oldest instance
// is still Pending (a lifecycle hook, a slow health check) while younger
// ones are InService, their members running with a view of all three. They
// do not bootstrap without it (by "the oldest InService instance" b would,
// and a, once InService, would too): a's member, started once a is
// InService, bootstraps the one group.
func TestOneGroupWhenAnOlderInstanceTurnsInServiceLate(t *testing.T) {
	t.Parallel()
	c := newOneGroupCluster(t, "92")
	c.f.SetDesired("web", 3)
	c.f.Launch(c.ids["a"], "web", "Pending", "Healthy", c.ips["a"])
	for _, name := range []string{"b", "c"} {
		c.f.Launch(c.ids[name], "web", "InService", "Healthy", c.ips[name])
		c.start(name, time.Second)
	}
	testkit.Eventually(t, 30*time.Second, "b and c looking for a group", func() bool {
		return c.counter.roundsOf("b") >= 3 && c.counter.roundsOf("c") >= 3
	})
	if got := c.counter.formed(); len(got) > 0 {
		t.Fatalf("%v bootstrapped while the oldest instance was Pending", got)
	}
	c.f.Set(c.ids["a"], func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	c.start("a", time.Second)
	c.checkOneGroup("a", 3)
}

// oneGroupCluster is an Auto Scaling group "web" in the fake AWS with
// instances a, b, c, d (launched in the order the test launches them; IDs
// sort d < a < b < c) on 127.0.NET3.1-4, and their raft members.
type oneGroupCluster struct {
	t       *testing.T
	f       *awsfake.Server
	ca      *certs.CA
	port    int
	counter *bootstrapCounter
	ids     map[string]string
	ips     map[string]string

	mu    sync.Mutex
	nodes map[string]*raft.Node
}

func newOneGroupCluster(t *testing.T, net3 string) *oneGroupCluster {
	f := awsfake.Start(t)
	f.AddGroup("web")
	ca, err := certs.NewCA("baton one-group test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := &oneGroupCluster{t: t, f: f, ca: ca, counter: &bootstrapCounter{rounds: map[string]int{}},
		ids:   map[string]string{"a": "i-0b00000000000000a", "b": "i-0c00000000000000b", "c": "i-0d00000000000000c", "d": "i-0a00000000000000d"},
		ips:   map[string]string{},
		nodes: map[string]*raft.Node{},
	}
	for i, name := range []string{"a", "b", "c", "d"} {
		c.ips[name] = fmt.Sprintf("127.0.%s.%d", net3, i+1)
	}
	c.port = freeLoopbackPort(t, net3)
	return c
}

// start starts the member of instance name, whose ASG caches answers for
// cacheTTL.
func (c *oneGroupCluster) start(name string, cacheTTL time.Duration) {
	t := c.t
	t.Helper()
	opts := fakeAWSOptions(t, c.f)
	opts.Port, opts.CacheTTL, opts.Logger = c.port, cacheTTL, nil
	asg, err := NewASG(opts)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := c.ca.Config("member", []string{c.ips[name]})
	if err != nil {
		t.Fatal(err)
	}
	n, err := raft.StartNode(raft.NodeOptions{
		ID: c.ids[name], BindAddr: net.JoinHostPort(c.ips[name], strconv.Itoa(c.port)),
		TLS: tlsCfg, Secret: "one-group-test-secret-0123456789",
		Discovery: asg, ExpectCounter: asg,
		Logger: c.counter.logger(t, name),
	})
	if err != nil {
		t.Fatalf("StartNode %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	c.mu.Lock()
	c.nodes[name] = n
	c.mu.Unlock()
}

// checkOneGroup waits until every member is in a group and checks that
// exactly one member, bootstrapper, bootstrapped one, and that all members
// share its raft leader and its configuration of size members.
func (c *oneGroupCluster) checkOneGroup(bootstrapper string, members int) {
	t := c.t
	t.Helper()
	c.mu.Lock()
	nodes := maps.Clone(c.nodes)
	c.mu.Unlock()
	testkit.Eventually(t, 90*time.Second, "every member in a group", func() bool {
		if len(c.counter.formed()) > 1 {
			return true // two groups: fail below
		}
		for _, n := range nodes {
			select {
			case <-n.Joined():
			default:
				return false
			}
		}
		return true
	})
	if got := c.counter.formed(); len(got) != 1 {
		t.Fatalf("members that bootstrapped a group: %v, want exactly one", got)
	}
	testkit.Eventually(t, 30*time.Second, "one leader and one configuration for all", func() bool {
		var leader string
		var all []string
		for name, n := range nodes {
			st := n.Status()
			if st.Leader == "" {
				return false
			}
			v := slices.Sorted(slices.Values(st.Members))
			if leader == "" {
				leader, all = st.Leader, v
			} else if st.Leader != leader || !slices.Equal(v, all) {
				t.Logf("%s: leader %s members %v; another: leader %s members %v", name, st.Leader, v, leader, all)
				return false
			}
		}
		return len(all) == members
	})
	if got := c.counter.formed(); !slices.Equal(got, []string{bootstrapper}) {
		t.Errorf("the group was bootstrapped by %v, want %s, the oldest instance", got, bootstrapper)
	}
}

// freeLoopbackPort returns a port free on 127.0.NET3.1-4.
func freeLoopbackPort(t *testing.T, net3 string) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0."+net3+".1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		free := true
		for i := 2; i <= 4; i++ {
			if l, err := net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.0.%s.%d", net3, i), strconv.Itoa(port))); err != nil {
				free = false
			} else {
				l.Close()
			}
		}
		if free {
			return port
		}
	}
	t.Fatalf("no port free on 127.0.%s.1-4", net3)
	return 0
}
