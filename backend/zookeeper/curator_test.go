package zookeeper_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// TestCuratorLeaderLatchInterop runs baton and Apache Curator's LeaderLatch
// (a real JVM) on one latch path against a real ZooKeeper, and kills each
// side in turn: leadership must alternate between them and never overlap,
// each must report the other as leader, and tokens (czxids) must grow
// across both.
func TestCuratorLeaderLatchInterop(t *testing.T) {
	t.Parallel()
	java, classPath := compileLatchMain(t)
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	const lease = "interop"
	latch := root + "/" + lease
	// Both sides time out their sessions after 2 s.
	cfg := backend.Config{TTL: 2 * time.Second}
	tl := &timeline{}
	ctx := testkit.Context(t, 2*time.Minute)

	g1 := startGo(t, srv.Addr(), root, lease, "go-1", cfg, tl)
	t1 := g1.awaitLeading(t, 10*time.Second)

	j1 := startJava(t, java, classPath, srv.Addr(), latch, "jvm-1", cfg.TTL, tl)
	j1.await(t, "STARTED", "jvm-1", 30*time.Second)
	j1.await(t, "SEES", "go-1", 10*time.Second) // Curator reports baton's leader
	if rec, err := g1.b.Leader(ctx, lease); err != nil || rec.Holder != "go-1" || rec.Token != t1.Token() {
		t.Fatalf("baton's Leader = %+v, %v; want go-1", rec, err)
	}

	// baton's holder dies: Curator takes over once ZooKeeper expires its
	// session, by when baton's term has ended at its safe-until.
	g1.kill(t)
	j1.await(t, "LEADER", "jvm-1", cfg.TTL+10*time.Second)

	g2 := startGo(t, srv.Addr(), root, lease, "go-2", cfg, tl)
	var jvm1 baton.Record
	testkit.Eventually(t, 10*time.Second, "baton to report Curator's leader", func() bool {
		var err error
		jvm1, err = g2.b.Leader(ctx, lease)
		return err == nil && jvm1.Holder == "jvm-1"
	})
	if jvm1.Token <= t1.Token() {
		t.Errorf("Curator's node czxid %d is not above go-1's token %d", jvm1.Token, t1.Token())
	}
	g2.awaitQueued(t, latch, 2)

	// Curator's holder dies (kill -9): baton takes over once ZooKeeper
	// expires the JVM's session.
	j1.kill(t)
	t2 := g2.awaitLeading(t, cfg.TTL+10*time.Second)
	if t2.Token() <= jvm1.Token {
		t.Errorf("go-2's token %d is not above jvm-1's %d", t2.Token(), jvm1.Token)
	}

	j2 := startJava(t, java, classPath, srv.Addr(), latch, "jvm-2", cfg.TTL, tl)
	j2.await(t, "SEES", "go-2", 30*time.Second)
	g2.kill(t)
	j2.await(t, "LEADER", "jvm-2", cfg.TTL+10*time.Second)

	g3 := startGo(t, srv.Addr(), root, lease, "go-3", cfg, tl)
	var jvm2 baton.Record
	testkit.Eventually(t, 10*time.Second, "baton to report Curator's second leader", func() bool {
		var err error
		jvm2, err = g3.b.Leader(ctx, lease)
		return err == nil && jvm2.Holder == "jvm-2"
	})
	g3.awaitQueued(t, latch, 2)

	// A graceful hand-over: closing the latch deletes Curator's node, so
	// baton takes over at once, well within a session timeout.
	closed := time.Now()
	j2.send(t, "close")
	j2.await(t, "CLOSED", "jvm-2", 10*time.Second)
	t3 := g3.awaitLeading(t, 10*time.Second)
	if took := time.Since(closed); took > cfg.TTL {
		t.Errorf("baton took %s to take over from a closed LeaderLatch; want less than the session timeout %s", took, cfg.TTL)
	}
	if t3.Token() <= jvm2.Token {
		t.Errorf("go-3's token %d is not above jvm-2's %d", t3.Token(), jvm2.Token)
	}
	g3.stop(t)
	j2.kill(t)

	ivs := tl.intervals()
	var order []string
	for _, iv := range ivs {
		order = append(order, iv.who)
	}
	if want := []string{"go-1", "jvm-1", "go-2", "jvm-2", "go-3"}; !slices.Equal(order, want) {
		t.Errorf("leaders in turn: %q, want %q", order, want)
	}
	for i, iv := range ivs {
		t.Logf("%-5s led %s for %s", iv.who, time.UnixMicro(iv.start).Format("15:04:05.000000"), time.Duration(iv.end-iv.start)*time.Microsecond)
		if iv.end == 0 {
			t.Errorf("%s's leadership never ended", iv.who)
		}
		if i > 0 && iv.start < ivs[i-1].end {
			t.Errorf("overlap: %s led from %s while %s led until %s", iv.who,
				time.UnixMicro(iv.start).Format("15:04:05.000000"), ivs[i-1].who, time.UnixMicro(ivs[i-1].end).Format("15:04:05.000000"))
		}
	}
}

// compileLatchMain compiles testdata/LatchMain.java into a temporary
// directory, and returns java and the class path to run it with.
func compileLatchMain(t *testing.T) (java, classPath string) {
	t.Helper()
	return testserver.CompileCurator(t, filepath.Join("testdata", "LatchMain.java"))
}

// interval is one leadership as its holder acted on it, in microseconds
// since the epoch: Java and Go read the same wall clock here, so their
// times compare.
type interval struct {
	who        string
	start, end int64
}

// timeline records who led when. Safe for concurrent use.
type timeline struct {
	mu   sync.Mutex
	ivs  []interval
	open map[string]int // who -> index of their open interval
}

func (tl *timeline) begin(who string, at int64) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.open == nil {
		tl.open = map[string]int{}
	}
	if _, ok := tl.open[who]; ok {
		return
	}
	tl.open[who] = len(tl.ivs)
	tl.ivs = append(tl.ivs, interval{who: who, start: at})
}

// end closes who's open interval, if any, at at.
func (tl *timeline) end(who string, at int64) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if i, ok := tl.open[who]; ok {
		tl.ivs[i].end = at
		delete(tl.open, who)
	}
}

func (tl *timeline) intervals() []interval {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	ivs := slices.Clone(tl.ivs)
	slices.SortFunc(ivs, func(a, b interval) int { return int(a.start - b.start) })
	return ivs
}

// goProc is a baton process: an Elector on a Backend with a connection of
// its own, through a proxy so that it can be killed without a word to the
// server.
type goProc struct {
	id      string
	proxy   *testserver.Proxy
	conn    *zk.Conn
	b       *zookeeper.Backend
	cancel  context.CancelFunc
	ran     chan error
	leading chan baton.Term
	ended   chan struct{} // closed when the callback returned
}

func startGo(t *testing.T, addr, root, lease, id string, cfg backend.Config, tl *timeline) *goProc {
	t.Helper()
	p := &goProc{id: id, proxy: testserver.StartProxy(t, addr), ran: make(chan error, 1),
		leading: make(chan baton.Term, 1), ended: make(chan struct{})}
	var probe *zookeeper.SessionProbe
	p.conn, probe = connect(t, p.proxy.Addr(), cfg)
	p.b = newBackend(t, p.conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
	e, err := baton.NewElector(p.b, baton.ElectorConfig{Lease: lease, Candidate: baton.Candidate{ID: id}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	var once sync.Once
	go func() {
		p.ran <- e.Run(ctx, func(fctx context.Context, term baton.Term) error {
			tl.begin(id, time.Now().UnixMicro())
			p.leading <- term
			<-fctx.Done()
			tl.end(id, time.Now().UnixMicro())
			once.Do(func() { close(p.ended) })
			// One term per process: a killed process leads no more.
			<-ctx.Done()
			return nil
		})
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *goProc) awaitLeading(t *testing.T, d time.Duration) baton.Term {
	t.Helper()
	select {
	case term := <-p.leading:
		return term
	case err := <-p.ran:
		t.Fatalf("%s's Elector stopped: %v", p.id, err)
	case <-time.After(d):
		t.Fatalf("%s did not lead within %s", p.id, d)
	}
	return nil
}

// awaitQueued waits until the latch has n candidates, this one among them.
func (p *goProc) awaitQueued(t *testing.T, latch string, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, p.id+" to queue", func() bool {
		kids, _, err := p.conn.Children(latch)
		return err == nil && len(kids) == n
	})
	select {
	case term := <-p.leading:
		t.Fatalf("%s leads (token %d) while another holds the latch", p.id, term.Token())
	default:
	}
}

// kill cuts the process off and closes its client without releasing
// anything, as kill -9 would, and waits until its term ended (at its
// safe-until).
func (p *goProc) kill(t *testing.T) {
	t.Helper()
	p.proxy.Cut()
	kill(p.conn)
	select {
	case <-p.ended:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s's term did not end within 10s of its death", p.id)
	}
	p.stop(t)
}

// stop ends the Elector's Run (resigning a term it holds).
func (p *goProc) stop(t *testing.T) {
	p.cancel()
	select {
	case err := <-p.ran:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s's Elector: %v", p.id, err)
		}
		p.ran <- err // for a second stop
	case <-time.After(10 * time.Second):
		t.Errorf("%s's Elector did not stop within 10s", p.id)
	}
}

// javaProc is a JVM running LatchMain.
type javaProc struct {
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *testserver.SyncBuffer
	out    *testserver.SyncBuffer // the events, with readable times
	events chan javaEvent
	exited chan struct{}
	tl     *timeline
}

type javaEvent struct {
	at         int64
	kind, what string
}

func startJava(t *testing.T, java, classPath, addr, latch, id string, session time.Duration, tl *timeline) *javaProc {
	t.Helper()
	args := append(slices.Clone(testserver.JavaQuickStart),
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classPath,
		"LatchMain", addr, latch, id, strconv.Itoa(int(session/time.Millisecond)))
	cmd := exec.Command(java, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &javaProc{id: id, cmd: cmd, stderr: new(testserver.SyncBuffer), out: new(testserver.SyncBuffer), events: make(chan javaEvent, 1000),
		exited: make(chan struct{}), tl: tl}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 3)
			if len(f) != 3 {
				continue
			}
			at, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				continue
			}
			ev := javaEvent{at: at, kind: f[1], what: f[2]}
			fmt.Fprintf(p.out, "%s %s %s\n", time.UnixMicro(at).Format("15:04:05.000000"), ev.kind, ev.what)
			switch ev.kind {
			case "LEADER":
				tl.begin(id, at)
			case "NOTLEADER", "RESIGNING":
				tl.end(id, at)
			}
			select {
			case p.events <- ev:
			default: // nobody listens for this many
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			t.Logf("%s printed:\n%s\nstderr:\n%s", id, p.out, p.stderr)
		}
	})
	return p
}

// await waits for the event kind with argument what.
func (p *javaProc) await(t *testing.T, kind, what string, d time.Duration) javaEvent {
	t.Helper()
	timeout := time.After(d)
	var seen []string
	for {
		select {
		case ev := <-p.events:
			seen = append(seen, ev.kind+" "+ev.what)
			if ev.kind == kind && ev.what == what {
				return ev
			}
		case <-p.exited:
			t.Fatalf("%s exited before %s %s; it printed %q; stderr:\n%s", p.id, kind, what, seen, p.stderr)
		case <-timeout:
			t.Fatalf("%s did not print %s %s within %s; it printed %q", p.id, kind, what, d, seen)
		}
	}
}

func (p *javaProc) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		t.Fatalf("%s: %v", p.id, err)
	}
}

// kill sends SIGKILL and waits for the JVM to be gone; a leadership it
// held ends then, the earliest time it certainly stopped acting.
func (p *javaProc) kill(t *testing.T) {
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Errorf("%s did not exit within 10s of SIGKILL", p.id)
	}
	p.tl.end(p.id, time.Now().UnixMicro())
}
