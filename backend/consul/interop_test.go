package consul_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// markerScript is the child `consul lock` runs: it appends "start NANOS" to
// a file when it starts and "end NANOS" when it is told to stop (SIGTERM,
// which the CLI forwards on shutdown or when it loses the lock). The times
// are wall-clock nanoseconds, comparable with time.Now().UnixNano() on the
// same machine.
const markerScript = `echo start $(date +%%s%%N) >> %[1]s; trap 'echo end $(date +%%s%%N) >> %[1]s; exit 0' TERM; while :; do sleep 0.02; done`

// cli is a running `consul lock`.
type cli struct {
	cmd    *exec.Cmd
	out    *testserver.SyncBuffer
	exited chan struct{}
	err    error // Wait's result; read after exited
}

// startLock starts `consul lock ARGS... PREFIX CHILD` against agent, and
// kills it when the test ends if it still runs.
func startLock(t *testing.T, agent *testserver.Consul, args ...string) *cli {
	t.Helper()
	return startLockAt(t, agent, agent.Addr(), args...)
}

// startLockAt is startLock with the CLI talking to the agent at addr (a
// front of it, such as a kvFront).
func startLockAt(t *testing.T, agent *testserver.Consul, addr string, args ...string) *cli {
	t.Helper()
	args = append([]string{"lock", "-http-addr=" + addr}, args...)
	c := &cli{cmd: exec.Command(agent.Binary(), args...), out: new(testserver.SyncBuffer), exited: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.Env = append(os.Environ(), "CONSUL_HTTP_TOKEN=", "CONSUL_HTTP_ADDR=")
	// A child left running by a killed CLI holds its output open; without
	// a bound, Wait (and so a failing test's cleanup) would wait for it.
	c.cmd.WaitDelay = 5 * time.Second
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start consul lock: %v", err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("consul %s:\n%s", strings.Join(args, " "), c.out)
		}
	})
	return c
}

// kvFront is an HTTP front of a Consul agent that records the KV reads
// passing through it, so that a test can see what a client is doing: a
// blocking query on a key (?index=N) is a client waiting for that key to
// change.
type kvFront struct {
	addr string
	mu   sync.Mutex
	seen []*url.URL // the KV GETs, as received
}

func startKVFront(t *testing.T, agent *testserver.Consul) *kvFront {
	t.Helper()
	target, err := url.Parse(agent.URL())
	if err != nil {
		t.Fatal(err)
	}
	f := &kvFront{}
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }}
	f.addr = testkit.ServeHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/kv/") {
			f.mu.Lock()
			f.seen = append(f.seen, r.URL)
			f.mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	return f
}

// blockingOn reports whether a blocking query on key has come through.
func (f *kvFront) blockingOn(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, u := range f.seen {
		if idx := u.Query().Get("index"); u.Path == "/v1/kv/"+key && idx != "" && idx != "0" {
			return true
		}
	}
	return false
}

// wait waits for the CLI to exit and returns its exit code.
func (c *cli) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(d):
		t.Fatalf("consul lock still running after %s; output:\n%s", d, c.out)
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		t.Fatalf("consul lock: %v", c.err)
	}
	return 0
}

// marks reads the marker file: the times of "start" and "end" lines.
func marks(t *testing.T, file string) (starts, ends []time.Time) {
	t.Helper()
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		what, ns, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil {
			t.Fatalf("marker line %q", sc.Text())
		}
		switch what {
		case "start":
			starts = append(starts, time.Unix(0, n))
		case "end":
			ends = append(ends, time.Unix(0, n))
		}
	}
	return starts, ends
}

// sessionNamed waits until the agent has a session called name, which a
// `consul lock` creates before it contends for its key.
func sessionNamed(t *testing.T, c *api.Client, name string) string {
	t.Helper()
	var id string
	testkit.EventuallyErr(t, 10*time.Second, "a session named "+name, func() error {
		ss, _, err := c.Session().List(nil)
		if err != nil {
			return err
		}
		for _, s := range ss {
			if s.Name == name {
				id = s.ID
				return nil
			}
		}
		return fmt.Errorf("no session named %q yet", name)
	})
	return id
}

// TestConsulLockInterop runs the real `consul lock` beside baton holders on
// one prefix: each waits for the other, and their times of acting never
// overlap.
func TestConsulLockInterop(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	const lease = "job"
	cliPrefix := prefix + lease // `consul lock PREFIX` locks PREFIX/.lock
	opts := consul.Options{Config: backend.Config{TTL: 4 * time.Second}, Prefix: prefix}
	a := newBackend(t, c, opts, nil)
	b := newBackend(t, agentClient(t, agent, agent.Addr()), opts, nil)
	file := filepath.Join(t.TempDir(), "marks")
	child := fmt.Sprintf(markerScript, file)

	// While baton holds, the CLI cannot lock: with -timeout it gives up,
	// and its child never runs.
	aStart := time.Now()
	ta := testkit.CampaignWithin(t, a, lease, "alpha", 10*time.Second)
	try := startLock(t, agent, "-timeout=1s", cliPrefix, child)
	if code := try.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("consul lock -timeout=1s succeeded while baton held %s:\n%s", cliPrefix, try.out)
	}
	if starts, _ := marks(t, file); len(starts) != 0 {
		t.Fatalf("the CLI's child ran while baton held the lease")
	}

	// Without a timeout it waits, and its child starts once baton resigns.
	front := startKVFront(t, agent)
	cl := startLockAt(t, agent, front.addr, "-name=cli-holder", cliPrefix, child)
	cliSession := sessionNamed(t, c, "cli-holder")
	// Once it sends a blocking query on the lock key, it has read the key,
	// seen baton's session on it, and waits for it to change: it has had
	// its chance to misbehave.
	testkit.Eventually(t, 10*time.Second, "consul lock to wait on "+cliPrefix+"/.lock", func() bool {
		return front.blockingOn(cliPrefix + "/.lock")
	})
	if starts, _ := marks(t, file); len(starts) != 0 {
		t.Fatalf("the CLI's child started while baton held the lease")
	}
	aEnd := time.Now() // the term ends as Resign begins
	if err := ta.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var cliStart time.Time
	testkit.EventuallyErr(t, 10*time.Second, "the CLI's child to start", func() error {
		starts, _ := marks(t, file)
		if len(starts) == 0 {
			return errors.New("the CLI's child has not started")
		}
		cliStart = starts[0]
		return nil
	})
	t.Logf("the CLI's child started %s after baton resigned", cliStart.Sub(aEnd))
	if cliStart.Before(aEnd) {
		t.Errorf("overlap: the CLI's child started at %v, while baton held until %v (since %v)", cliStart, aEnd, aStart)
	}

	// While the CLI holds, Leader reports it, and baton waits.
	rec, err := a.Leader(testkit.Context(t, 5*time.Second), lease)
	if err != nil {
		t.Fatalf("Leader while the CLI holds: %v", err)
	}
	if !strings.HasPrefix(rec.Holder, "cli-holder (consul session "+cliSession) || rec.Token <= ta.Token() {
		t.Errorf("Leader = %+v; want the CLI's session cli-holder, with a token above baton's %d", rec, ta.Token())
	}
	if _, err := a.Campaign(testkit.Context(t, 500*time.Millisecond), lease, baton.Candidate{ID: "alpha"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign while the CLI holds: err = %v; want it to wait until its deadline", err)
	}
	got := testkit.CampaignAsync(t, b, lease, "beta")
	notYet(t, got, 300*time.Millisecond)

	// SIGTERM makes the CLI stop its child and release the lock: baton wins.
	if err := cl.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	w := testkit.WaitTerm(t, got, 15*time.Second)
	if code := cl.wait(t, 15*time.Second); code != 0 {
		t.Errorf("consul lock exited with %d after SIGTERM; want 0", code)
	}
	starts, ends := marks(t, file)
	if len(starts) != 1 || len(ends) != 1 {
		t.Fatalf("marker file has starts %v, ends %v; want one of each", starts, ends)
	}
	t.Logf("baton took over %s after the CLI's child ended", w.At.Sub(ends[0]))
	if w.At.Before(ends[0]) {
		t.Errorf("overlap: baton acquired at %v, before the CLI's child ended at %v", w.At, ends[0])
	}
	if w.Term.Token() <= rec.Token {
		t.Errorf("baton's token %d after the CLI is not greater than the CLI's %d", w.Term.Token(), rec.Token)
	}
	rec, err = a.Leader(testkit.Context(t, 5*time.Second), lease)
	if err != nil || rec.Holder != "beta" || rec.Token != w.Term.Token() {
		t.Errorf("Leader = %+v, %v; want beta with token %d", rec, err, w.Term.Token())
	}
}

// TestConsulLockSemaphoreConflict: `consul lock -n 2` keeps a semaphore at
// the same key; baton refuses it with ErrKeyConflict rather than waiting
// forever or overwriting it, and the CLI likewise refuses baton's lock.
func TestConsulLockSemaphoreConflict(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Prefix: prefix}, nil)
	file := filepath.Join(t.TempDir(), "marks")

	sem := startLock(t, agent, "-n=2", prefix+"sem", fmt.Sprintf(markerScript, file))
	testkit.EventuallyErr(t, 10*time.Second, "the semaphore holder's child to start", func() error {
		if starts, _ := marks(t, file); len(starts) == 0 {
			return errors.New("the semaphore holder's child has not started")
		}
		return nil
	})
	if _, err := b.Campaign(testkit.Context(t, 5*time.Second), "sem", baton.Candidate{ID: "x"}); !errors.Is(err, consul.ErrKeyConflict) {
		t.Errorf("Campaign on a semaphore's prefix: err = %v, want ErrKeyConflict", err)
	}
	if _, err := b.Leader(testkit.Context(t, 5*time.Second), "sem"); !errors.Is(err, consul.ErrKeyConflict) {
		t.Errorf("Leader on a semaphore's prefix: err = %v, want ErrKeyConflict", err)
	}
	_ = sem.cmd.Process.Signal(syscall.SIGTERM)
	sem.wait(t, 15*time.Second)

	testkit.CampaignWithin(t, b, "lock", "x", 10*time.Second)
	try := startLock(t, agent, "-n=2", "-timeout=2s", prefix+"lock", "true")
	if code := try.wait(t, 30*time.Second); code == 0 {
		t.Errorf("consul lock -n 2 succeeded on baton's lock")
	}
	if !strings.Contains(try.out.String(), api.ErrSemaphoreConflict.Error()) {
		t.Errorf("consul lock -n 2 on baton's lock said:\n%s\nwant %q", try.out, api.ErrSemaphoreConflict)
	}
}
