package etcd_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestConformance(t *testing.T) { batontest.Run(t, target(t)) }

// TestLeaderWatch: a standby hears who leads from the Backend's watch
// (baton.LeaderWatcher), without asking.
func TestLeaderWatch(t *testing.T) { batontest.LeaderWatch(t, target(t)) }

// target is the conformance suite's Target: processes on one server.
func target(t *testing.T) batontest.Target {
	srv := testserver.StartEtcd(t)
	counter := etcd.NewTestClient(t, srv.Endpoint())
	return batontest.Target{
		OneCampaignPerName: true,
		MinTTL:             time.Second, // etcd grants whole seconds
		// The election's keys, as concurrency.Election lays them out.
		Candidates: func(t *testing.T, lease string) int {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := counter.Get(ctx, lease+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatalf("count the keys of election %s: %v", lease, err)
			}
			return int(resp.Count)
		},
		New: func(t *testing.T, cfg backend.Config) *batontest.Process {
			// Each process reaches etcd through a proxy of its own, so that
			// cutting one off leaves the others connected.
			proxy := testserver.StartProxy(t, srv.Endpoint())
			client := etcd.NewTestClient(t, proxy.Addr())
			b := newBackend(t, client, etcd.Options{Config: cfg})
			var once sync.Once
			killed := make(chan struct{})
			return &batontest.Process{
				Backend: b,
				// A process killed with -9 never revokes its session: close
				// the connection without Close, and never heal it.
				Kill: func() {
					once.Do(func() {
						close(killed)
						proxy.Cut()
						_ = client.Close()
					})
				},
				Cut: proxy.Cut,
				Heal: func() {
					select {
					case <-killed:
					default:
						proxy.Heal()
					}
				},
			}
		},
	}
}

// newBackend returns a Backend on client, closed when the test ends (before
// the client, since cleanups run last-in first-out).
func newBackend(t *testing.T, client *clientv3.Client, opts etcd.Options) *etcd.Backend {
	t.Helper()
	b, err := etcd.New(client, opts)
	if err != nil {
		t.Fatalf("etcd.New: %v", err)
	}
	// A killed process's client is closed, so its revoke fails: Close's
	// error says nothing about the backend.
	return testkit.CloseAtEnd(t, b, 5*time.Second)
}

// keys returns the election keys of lease, oldest first.
func keys(t *testing.T, c *clientv3.Client, election string) []string {
	t.Helper()
	resp, err := c.Get(testkit.Context(t, 5*time.Second), election+"/",
		clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("get %s/: %v", election, err)
	}
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

// awaitKeys waits, by watching, until election has n keys, and returns them.
func awaitKeys(t *testing.T, c *clientv3.Client, election string, n int) []string {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	for {
		resp, err := c.Get(ctx, election+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatalf("waiting for %d keys under %s/: %v", n, election, err)
		}
		if len(resp.Kvs) >= n {
			ks := make([]string, len(resp.Kvs))
			for i, kv := range resp.Kvs {
				ks[i] = string(kv.Key)
			}
			return ks
		}
		wctx, cancel := context.WithCancel(ctx)
		<-c.Watch(wctx, election+"/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		cancel()
	}
}

func etcdctl(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("etcdctl")
	if err != nil {
		testserver.Unavailable(t, "etcdctl", fmt.Errorf("%w (Debian: apt-get install etcd-client)", err))
	}
	return path
}

// etcdctlCmd prepares an etcdctl command against endpoint, killed when the
// test ends if still running.
func etcdctlCmd(t *testing.T, path, endpoint string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(testkit.Context(t, 30*time.Second), path, append([]string{"--endpoints=" + endpoint}, args...)...)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	return cmd
}

// TestEtcdctlElectListenSeesHolder checks the interoperability the key layout
// exists for: etcd's own tool reports baton's holder, and follows hand-overs.
func TestEtcdctlElectListenSeesHolder(t *testing.T) {
	bin := etcdctl(t)
	srv := testserver.StartEtcd(t)
	a := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), etcd.Options{})
	b := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), etcd.Options{})
	const lease = "interop"

	ta := testkit.CampaignWithin(t, a, lease, "alpha/1", 10*time.Second)

	cmd := etcdctlCmd(t, bin, srv.Endpoint(), "elect", "--listen", lease)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start etcdctl: %v", err)
	}
	lines := make(chan string)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range lines { // unblock the scanner so that Wait can close the pipe
		}
		<-scanned
		_ = cmd.Wait()
	})
	// etcdctl prints the holder's key, then its value, for each holder.
	expect := func(id string) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		var seen []string
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("etcdctl exited before printing %q; it printed %q; stderr: %s", id, seen, stderr.String())
				}
				seen = append(seen, line)
				if line == id {
					if len(seen) < 2 || !strings.HasPrefix(seen[len(seen)-2], lease+"/") {
						t.Errorf("etcdctl printed %q before %q, want the election key %s/<lease ID>", seen, id, lease)
					}
					return
				}
			case <-timeout:
				t.Fatalf("etcdctl did not print %q within 20s; it printed %q", id, seen)
			}
		}
	}
	expect("alpha/1")

	got := testkit.CampaignAsync(t, b, lease, "beta/2")
	if err := ta.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatalf("resign: %v", err)
	}
	tb := testkit.WaitTerm(t, got, 10*time.Second).Term
	if tb.Token() <= ta.Token() {
		t.Errorf("beta's token %d is not greater than alpha's %d", tb.Token(), ta.Token())
	}
	expect("beta/2")
}

// TestOperatorDeleteEndsTerm: `etcdctl del` of the holder's key is how an
// operator forces a hand-over, so the holder must notice and stop.
func TestOperatorDeleteEndsTerm(t *testing.T) {
	bin := etcdctl(t)
	srv := testserver.StartEtcd(t)
	c := etcd.NewTestClient(t, srv.Endpoint())
	a := newBackend(t, c, etcd.Options{Prefix: "ops/"})
	b := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), etcd.Options{Prefix: "ops/"})
	const lease = "deleted"

	ta := testkit.CampaignWithin(t, a, lease, "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, lease, "b")
	ks := awaitKeys(t, c, "ops/"+lease, 2) // b is queued behind a
	out, err := etcdctlCmd(t, bin, srv.Endpoint(), "del", ks[0]).CombinedOutput()
	if err != nil {
		t.Fatalf("etcdctl del %s: %v\n%s", ks[0], err, out)
	}
	if strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("etcdctl del %s printed %q, want 1 key deleted", ks[0], out)
	}
	testkit.WaitDone(t, ta, 5*time.Second)
	if err := ta.Err(); !errors.Is(err, baton.ErrLeaseLost) {
		t.Errorf("after etcdctl del, Err() = %v, want ErrLeaseLost", err)
	}
	tb := testkit.WaitTerm(t, got, 5*time.Second).Term
	if tb.Token() <= ta.Token() {
		t.Errorf("b's token %d is not greater than a's %d", tb.Token(), ta.Token())
	}
	// a's name is free again: it can queue behind b.
	got = testkit.CampaignAsync(t, a, lease, "a")
	if err := tb.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ta2 := testkit.WaitTerm(t, got, 5*time.Second).Term
	if ta2.Token() <= tb.Token() {
		t.Errorf("a's new token %d is not greater than b's %d", ta2.Token(), tb.Token())
	}
}

// TestSessionRevokedEndsTerms: when etcd says the session is gone, every term
// on it is lost, and the next campaign starts a new session.
func TestSessionRevokedEndsTerms(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := etcd.NewTestClient(t, srv.Endpoint())
	b := newBackend(t, c, etcd.Options{Config: backend.Config{TTL: 2 * time.Second}})

	t1 := testkit.CampaignWithin(t, b, "one", "x", 10*time.Second)
	t2 := testkit.CampaignWithin(t, b, "two", "x", 10*time.Second)
	k1, k2 := keys(t, c, "one"), keys(t, c, "two")
	if len(k1) != 1 || len(k2) != 1 {
		t.Fatalf("keys: %q, %q; want one each", k1, k2)
	}
	id1, id2 := strings.TrimPrefix(k1[0], "one/"), strings.TrimPrefix(k2[0], "two/")
	if id1 != id2 {
		t.Fatalf("leases of one Backend ride on different sessions: %s, %s", id1, id2)
	}
	var lease int64
	if _, err := fmt.Sscanf(id1, "%x", &lease); err != nil {
		t.Fatalf("key %s does not end in a hexadecimal lease ID: %v", k1[0], err)
	}
	if _, err := c.Revoke(testkit.Context(t, 5*time.Second), clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	for _, term := range []baton.Term{t1, t2} {
		testkit.WaitDone(t, term, 5*time.Second)
		if !errors.Is(term.Err(), baton.ErrLeaseLost) {
			t.Errorf("%s: Err() = %v, want ErrLeaseLost", term.Lease(), term.Err())
		}
	}
	t3 := testkit.CampaignWithin(t, b, "one", "x", 10*time.Second)
	if k := keys(t, c, "one"); len(k) != 1 || k[0] == k1[0] {
		t.Errorf("after the session was revoked, keys = %q; want one key of a new session", k)
	}
	if t3.Token() <= t1.Token() {
		t.Errorf("token %d after revoke is not greater than %d", t3.Token(), t1.Token())
	}
}

func TestCloseHandsOverAtOnce(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cfg := backend.Config{TTL: 20 * time.Second}
	a := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), etcd.Options{Config: cfg})
	b := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), etcd.Options{Config: cfg})

	ta := testkit.CampaignWithin(t, a, "closing", "a", 10*time.Second)
	got := testkit.CampaignAsync(t, b, "closing", "b")
	if err := a.Close(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !errors.Is(ta.Err(), baton.ErrClosed) {
		t.Errorf("after Close, Err() = %v, want ErrClosed", ta.Err())
	}
	// Well within the 20 s TTL: the revoke, not expiry, let b in. A
	// Campaign and a Close after Close: batontest's CloseEndsTermsAndRefusesCampaigns.
	testkit.WaitTerm(t, got, 5*time.Second)
}

func TestTTLRoundedUpToWholeSeconds(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := etcd.NewTestClient(t, srv.Endpoint())
	b := newBackend(t, c, etcd.Options{Config: backend.Config{TTL: 1500 * time.Millisecond}})
	start := time.Now()
	term := testkit.CampaignWithin(t, b, "rounded", "x", 10*time.Second)
	k := keys(t, c, "rounded")
	var lease int64
	if _, err := fmt.Sscanf(strings.TrimPrefix(k[0], "rounded/"), "%x", &lease); err != nil {
		t.Fatal(err)
	}
	resp, err := c.TimeToLive(testkit.Context(t, 5*time.Second), clientv3.LeaseID(lease))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GrantedTTL != 2 {
		t.Errorf("granted TTL %d s, want 1.5 s rounded up to 2", resp.GrantedTTL)
	}
	// Safe-until is timed by the client's own TTL, not by the longer one
	// etcd granted (a client believes no server about time): 1.5 s minus
	// the 150 ms margin from a renewal's send time, checked after every
	// renewal for a second.
	if got := term.SafeUntil().Sub(start); got < 1350*time.Millisecond {
		t.Errorf("SafeUntil is %s after the campaign began; want at least 1.5 s - 150 ms", got)
	}
	first := term.SafeUntil()
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if ahead := time.Until(term.SafeUntil()); ahead > 1350*time.Millisecond {
			t.Fatalf("SafeUntil is %s ahead with etcd's 2 s granted; want at most the TTL's 1.5 s - 150 ms", ahead)
		}
	}
	if term.Err() != nil || !term.SafeUntil().After(first) {
		t.Fatalf("the term was not renewed (err %v): the check above saw no renewal", term.Err())
	}
}

func TestInvalidOptionsAndNames(t *testing.T) {
	if _, err := etcd.New(nil, etcd.Options{}); err == nil {
		t.Error("New(nil client) succeeded")
	}
	srv := testserver.StartEtcd(t)
	c := etcd.NewTestClient(t, srv.Endpoint())
	if _, err := etcd.New(c, etcd.Options{Config: backend.Config{TTL: -time.Second}}); err == nil {
		t.Error("New with a negative TTL succeeded")
	}
	b := newBackend(t, c, etcd.Options{})
	for _, name := range []string{"", "a/b"} {
		if _, err := b.Campaign(testkit.Context(t, time.Second), name, baton.Candidate{ID: "x"}); err == nil {
			t.Errorf("Campaign(%q) succeeded", name)
		}
	}
	if _, err := b.Leader(testkit.Context(t, time.Second), "nobody"); !errors.Is(err, baton.ErrNoLeader) {
		t.Errorf("Leader of an empty election: err = %v, want ErrNoLeader", err)
	}
}

// An unreachable etcd must surface as ErrBackendUnavailable, so the Elector
// logs it and retries, instead of a campaign that blocks silently.
func TestUnreachableServerIsReported(t *testing.T) {
	proxy := testserver.StartProxy(t, testserver.StartEtcd(t).Endpoint())
	proxy.Cut()
	b := newBackend(t, etcd.NewTestClient(t, proxy.Addr()), etcd.Options{Config: backend.Config{TTL: time.Second}})
	_, err := b.Campaign(testkit.Context(t, time.Minute), "unreachable", baton.Candidate{ID: "a"})
	if !errors.Is(err, baton.ErrBackendUnavailable) {
		t.Fatalf("Campaign against an unreachable etcd: err = %v, want ErrBackendUnavailable", err)
	}
}

// TestRenewalWindow: the holder renews every TTL/2 by default, and the
// renewal window Backend and Options answer (what `baton run --grace` must
// fit in) is TTL − TTL/2 − DriftMargin.
func TestRenewalWindow(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := etcd.NewTestClient(t, srv.Endpoint())
	for _, tc := range []struct {
		cfg         backend.Config
		renew, want time.Duration
	}{
		{backend.Config{}, 5 * time.Second, 4 * time.Second},
		{backend.Config{TTL: 2 * time.Second}, time.Second, 800 * time.Millisecond},
		{backend.Config{TTL: 2 * time.Second, RenewInterval: 500 * time.Millisecond}, 500 * time.Millisecond, 1300 * time.Millisecond},
	} {
		b := newBackend(t, c, etcd.Options{Config: tc.cfg})
		if got := b.Config().RenewInterval; got != tc.renew {
			t.Errorf("%+v: RenewInterval %s, want %s", tc.cfg, got, tc.renew)
		}
		if got := b.RenewalWindow(); got != tc.want {
			t.Errorf("%+v: Backend.RenewalWindow %s, want %s", tc.cfg, got, tc.want)
		}
		if got, err := (etcd.Options{Config: tc.cfg}).RenewalWindow(); err != nil || got != tc.want {
			t.Errorf("%+v: Options.RenewalWindow %s, %v; want %s", tc.cfg, got, err, tc.want)
		}
	}
	if _, err := (etcd.Options{Config: backend.Config{TTL: 2 * time.Second, RenewInterval: 2 * time.Second}}).RenewalWindow(); err == nil {
		t.Error("Options.RenewalWindow with RenewInterval = TTL: no error, want New's")
	}
}
