package aws

import (
	"context"
	"fmt"
	"log/slog"
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
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.SetDesired("web", 3)
	ca, err := certs.NewCA("baton one-group test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	port := freeLoopbackPort(t)
	counter := &bootstrapCounter{rounds: map[string]int{}}
	// IDs sort d < a < b < c; launch order is a, b, c, d.
	ids := map[string]string{"a": "i-0b00000000000000a", "b": "i-0c00000000000000b", "c": "i-0d00000000000000c", "d": "i-0a00000000000000d"}
	ips := map[string]string{"a": "127.0.91.1", "b": "127.0.91.2", "c": "127.0.91.3", "d": "127.0.91.4"}
	nodes := map[string]*raft.Node{}
	var mu sync.Mutex
	start := func(name string, cacheTTL time.Duration) {
		t.Helper()
		opts := fakeAWSOptions(t, f)
		opts.Port, opts.CacheTTL, opts.Logger = port, cacheTTL, nil
		asg, err := NewASG(opts)
		if err != nil {
			t.Fatal(err)
		}
		tlsCfg, err := ca.Config("member", []string{ips[name]})
		if err != nil {
			t.Fatal(err)
		}
		n, err := raft.StartNode(raft.NodeOptions{
			ID: ids[name], BindAddr: net.JoinHostPort(ips[name], strconv.Itoa(port)),
			TLS: tlsCfg, Secret: "one-group-test-secret-0123456789",
			Discovery: asg, ExpectCounter: asg,
			Logger: counter.logger(t, name),
		})
		if err != nil {
			t.Fatalf("StartNode %s: %v", name, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = n.Close(ctx)
		})
		mu.Lock()
		nodes[name] = n
		mu.Unlock()
	}
	for _, name := range []string{"a", "b", "c"} {
		f.Launch(ids[name], "web", "InService", "Healthy", ips[name])
	}
	start("a", 10*time.Minute)
	testkit.Eventually(t, 30*time.Second, "a looking for b and c", func() bool { return counter.roundsOf("a") >= 2 })

	f.SetDesired("web", 4)
	f.Launch(ids["d"], "web", "Pending", "Healthy", ips["d"])
	f.Set(ids["d"], func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	start("d", time.Second)
	testkit.Eventually(t, 30*time.Second, "d looking for a group", func() bool { return counter.roundsOf("d") >= 2 })
	// b first: d has the three it bootstraps with by its rule (d, a, b),
	// a not yet; c as soon as d has bootstrapped (or looked twice more),
	// while the raft election of d's group has not reached a and b.
	dRounds := counter.roundsOf("d")
	start("b", time.Second)
	testkit.Eventually(t, 30*time.Second, "d bootstrapping, or looking again", func() bool {
		return len(counter.formed()) > 0 || counter.roundsOf("d") >= dRounds+2
	})
	start("c", time.Second)

	testkit.Eventually(t, 90*time.Second, "every member in a group", func() bool {
		if len(counter.formed()) > 1 {
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
	if got := counter.formed(); len(got) != 1 {
		t.Fatalf("members that bootstrapped a group: %v, want exactly one", got)
	}
	testkit.Eventually(t, 30*time.Second, "one leader and one configuration for all", func() bool {
		var leader string
		var voters []string
		for name, n := range nodes {
			st := n.Status()
			if st.Leader == "" {
				return false
			}
			v := slices.Sorted(slices.Values(st.Members))
			if leader == "" {
				leader, voters = st.Leader, v
			} else if st.Leader != leader || !slices.Equal(v, voters) {
				t.Logf("%s: leader %s members %v; another: leader %s members %v", name, st.Leader, v, leader, voters)
				return false
			}
		}
		return len(voters) == 4
	})
	if got := counter.formed(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("the group was bootstrapped by %v, want a, the oldest instance", got)
	}
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.91.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		free := true
		for i := 2; i <= 4; i++ {
			if l, err := net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.0.91.%d", i), strconv.Itoa(port))); err != nil {
				free = false
			} else {
				l.Close()
			}
		}
		if free {
			return port
		}
	}
	t.Fatal("no port free on 127.0.91.1-4")
	return 0
}
