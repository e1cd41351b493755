package raftagent

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	batonbackend "github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testkit"
)

// testGroup is a raft group of in-process members on loopback: real
// members, real Backends, as in backend/raft's own tests.
type testGroup struct {
	ca *certs.CA

	mu    sync.Mutex
	addrs []string
	nodes []*raft.Node
}

// Peers implements raft.Discoverer over the group's addresses.
func (g *testGroup) Peers(context.Context) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.addrs), nil
}

const testSecret = "0123456789abcdef-raftagent-test"

func testLogger() *slog.Logger {
	if os.Getenv("BATON_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newGroup starts voters members that bootstrap a group, each changed by
// opt (given the member's index), and waits until all are in it.
func newGroup(t testing.TB, voters int, opt func(i int, o *raft.NodeOptions)) *testGroup {
	t.Helper()
	ca, err := certs.NewCA("raftagent test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	g := &testGroup{ca: ca}
	for i := range voters {
		tlsCfg, err := ca.Config("member", []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		o := raft.NodeOptions{
			BindAddr: "127.0.0.1:0", TLS: tlsCfg, Secret: testSecret, Discovery: g,
			BootstrapExpect: voters, Voters: voters,
			HeartbeatTimeout: 200 * time.Millisecond, DeadServerAfter: 2 * time.Second, StabilizationTime: 300 * time.Millisecond,
			Logger: testLogger(),
		}
		if opt != nil {
			opt(i, &o)
		}
		n, err := raft.StartNode(o)
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
		})
	}
	for _, n := range g.nodes {
		select {
		case <-n.Joined():
		case <-time.After(60 * time.Second):
			t.Fatalf("member %s did not join: %+v", n.ID(), n.Status())
		}
	}
	testkit.Eventually(t, 30*time.Second, "every member determined", func() bool {
		for _, n := range g.nodes {
			if n.Determined() != nil {
				return false
			}
		}
		return true
	})
	return g
}

// backend returns a Backend campaigning through gr (a member or an agent
// client), closed when the test ends.
func backend(t testing.TB, gr raft.Group, ttl time.Duration) *raft.Backend {
	t.Helper()
	b, err := raft.New(gr, raft.Options{Config: batonbackend.Config{TTL: ttl}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return testkit.CloseAtEnd(t, b, 3*time.Second)
}

// resignWhenAsked does with term what an Elector does when its resign is
// requested: it stops the work (here: winds down for windDown), then
// resigns. The channel yields when the work stopped, just before the
// Resign.
func resignWhenAsked(t testing.TB, term baton.Term, windDown time.Duration) <-chan time.Time {
	stopped := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		select {
		case <-baton.ResignRequestedOf(term):
		case <-term.Done():
			return
		case <-ctx.Done():
			return
		}
		time.Sleep(windDown) // the work winding down, as a child in its grace period
		stopped <- time.Now()
		if err := term.Resign(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("resign after the request: %v", err)
		}
	}()
	return stopped
}

// agentServer serves h as `baton agent` does. It returns the address.
func agentServer(t testing.TB, n *raft.Node, h http.Handler) string {
	t.Helper()
	return testkit.ServeHTTP(t, h)
}

// testToken is the agent token of the test agents (newHandler, when
// opts has none).
const testToken = "agent-test-token"

// newHandler returns a Handler of n, closed when the test ends.
func newHandler(t testing.TB, n *raft.Node, opts Options) *Handler {
	t.Helper()
	if opts.Token == "" {
		opts.Token = testToken
	}
	h, err := New(n, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// response is a call's status, headers and body.
type response struct {
	status int
	header http.Header
	body   string
}

// call makes one request to the agent at addr.
func call(t testing.TB, method, addr, path string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// decode decodes r's JSON body into v, failing the test on an error.
func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.NewDecoder(strings.NewReader(r.body)).Decode(v); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
}
