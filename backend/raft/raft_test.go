package raft

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testkit"
	hraft "github.com/hashicorp/raft"
)

// testGroup is a raft group of in-process members on loopback.
type testGroup struct {
	t      testing.TB
	ca     *certs.CA
	secret string
	// opt changes the options of every member the group starts, before
	// start's own.
	opt []func(*NodeOptions)

	mu    sync.Mutex
	addrs []string
	nodes []*Node
}

// peers is a Discoverer over the group's current addresses.
type peers struct{ g *testGroup }

func (p peers) Peers(context.Context) ([]string, error) {
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	return slices.Clone(p.g.addrs), nil
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("BATON_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newTestGroup starts voters members that bootstrap a group, and waits
// until all are in it. opt changes the options of every member of the
// group, the later ones included.
func newTestGroup(t testing.TB, voters int, opt ...func(*NodeOptions)) *testGroup {
	t.Helper()
	ca, err := certs.NewCA("baton test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	g := &testGroup{t: t, ca: ca, secret: "0123456789abcdef-test-secret", opt: opt}
	for range voters {
		g.start(t, func(o *NodeOptions) { o.BootstrapExpect = voters; o.Voters = voters })
	}
	g.waitJoined(t)
	return g
}

func (g *testGroup) options(t testing.TB) NodeOptions {
	t.Helper()
	tlsCfg, err := g.ca.Config("member", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	return NodeOptions{
		BindAddr:          "127.0.0.1:0",
		TLS:               tlsCfg,
		Secret:            g.secret,
		Discovery:         peers{g},
		HeartbeatTimeout:  200 * time.Millisecond,
		DeadServerAfter:   2 * time.Second,
		StabilizationTime: 300 * time.Millisecond,
		Logger:            testLogger(t),
	}
}

// start starts a member with the group's defaults, changed by opt.
func (g *testGroup) start(t testing.TB, opt ...func(*NodeOptions)) *Node {
	t.Helper()
	o := g.options(t)
	for _, f := range slices.Concat(g.opt, opt) {
		f(&o)
	}
	n, err := StartNode(o)
	if err != nil {
		t.Fatalf("StartNode: %v", err)
	}
	g.mu.Lock()
	g.addrs = append(g.addrs, n.Addr())
	g.nodes = append(g.nodes, n)
	g.mu.Unlock()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = n.Close(ctx)
		g.forget(n)
	})
	return n
}

func (g *testGroup) forget(n *Node) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.addrs = slices.DeleteFunc(g.addrs, func(a string) bool { return a == n.Addr() })
	g.nodes = slices.DeleteFunc(g.nodes, func(x *Node) bool { return x == n })
}

func (g *testGroup) members() []*Node {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.nodes)
}

func (g *testGroup) waitJoined(t testing.TB) {
	t.Helper()
	for _, n := range g.members() {
		select {
		case <-n.Joined():
		case <-time.After(30 * time.Second):
			t.Fatalf("member %s did not join: %+v", n.ID(), n.Status())
		}
	}
}

func (g *testGroup) leader() *Node {
	for _, n := range g.members() {
		if n.isReady() {
			return n
		}
	}
	return nil
}

func newBackend(t testing.TB, gr Group, cfg backend.Config) *Backend {
	t.Helper()
	b, err := New(gr, Options{Config: cfg, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return testkit.CloseAtEnd(t, b, 3*time.Second)
}

func TestGroupBootstrapsAndElects(t *testing.T) {
	g := newTestGroup(t, 3)
	// readyLeaderOf keeps the leader it found: g.leader() again could be
	// nil, should leadership move in between.
	st := readyLeaderOf(t, g).Status()
	if len(st.Voters) != 3 {
		t.Fatalf("voters = %v, want 3", st.Voters)
	}
	b := newBackend(t, g.members()[1], backend.Config{TTL: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	term, err := b.Campaign(ctx, "job", baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.Leader(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Holder != "a" || rec.Token != term.Token() {
		t.Fatalf("Leader = %+v, want holder a token %d", rec, term.Token())
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Leader(ctx, "job"); !errors.Is(err, baton.ErrNoLeader) {
		t.Fatalf("Leader after resign: %v, want ErrNoLeader", err)
	}
}

// TestNoPipelinedReplication guards the transport setting that keeps
// hashicorp/raft's pipeline deadlock away (see startRaft): a member that
// replicated through a pipeline could hang in Close for good.
func TestNoPipelinedReplication(t *testing.T) {
	g := newTestGroup(t, 1)
	n := g.members()[0]
	p, err := n.trans.AppendEntriesPipeline("peer", "127.0.0.1:1")
	if p != nil {
		p.Close()
	}
	if !errors.Is(err, hraft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("AppendEntriesPipeline: %v, want ErrPipelineReplicationNotSupported", err)
	}
}

func TestOptionsErrors(t *testing.T) {
	_, err := StartNode(NodeOptions{Secret: "short"})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *baton.ConfigError", err)
	}
	for _, want := range []string{"BindAddr", "Secret is 5 bytes"} {
		if !containsProblem(ce.Problems, want) {
			t.Errorf("problems %q lack %q", ce.Problems, want)
		}
	}
	// A nil TLS is the secret-only mode, not a problem.
	if containsProblem(ce.Problems, "TLS") {
		t.Errorf("problems %q name TLS, which nil leaves to the secret-only mode", ce.Problems)
	}
}

func containsProblem(ps []string, sub string) bool {
	return slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, sub) })
}
