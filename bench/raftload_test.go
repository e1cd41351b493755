package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testserver"
)

// The environment variables that make this test binary a raft member
// process or a CPU hog (see TestMain) instead of running benchmarks.
const (
	envMember  = "BATON_BENCH_RAFT_MEMBER" // the group's directory: CA, certificates, peers file
	envIndex   = "BATON_BENCH_RAFT_INDEX"  // the member's index in the group
	envHT      = "BATON_BENCH_RAFT_HT"     // NodeOptions.HeartbeatTimeout; empty for the default
	envTTL     = "BATON_BENCH_RAFT_TTL"    // the session TTL; empty for the default
	envLeases  = "BATON_BENCH_RAFT_LEASES" // how many leases of its own the member holds
	envHog     = "BATON_BENCH_HOG"         // busy-looping threads
	loadLeases = 10
)

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(envMember) != "":
		os.Exit(raftMemberMain())
	case os.Getenv(envHog) != "":
		hogMain()
	case os.Getenv(envCandWorker) != "":
		os.Exit(candidateWorkerMain())
	}
	code := m.Run()
	testserver.StopSharedPostgres()
	os.Exit(code)
}

// hogMain spins envHog threads until it is killed: a CPU-bound
// neighbour of the members, as a busy application beside them would be.
func hogMain() {
	n, _ := strconv.Atoi(os.Getenv(envHog))
	runtime.GOMAXPROCS(n)
	for range n - 1 {
		go spin()
	}
	spin()
}

var spinSink uint64

func spin() {
	var x uint64
	for {
		for range 1 << 20 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		spinSink = x
	}
}

// raftMemberMain runs one member of a three-voter group with the default
// timings (or envHT, envTTL), holding envLeases leases of its own through a
// Backend, and reports on stdout:
//
//	ADDR host:port        once it listens
//	READY                 once it holds all its leases
//	STATE s               each change of its raft state (Leader, Follower, Candidate)
//	LOST lease reason     a term that ended (the lease is campaigned for again)
//	GAP ms                answer to "gap": the longest time between two
//	                      confirmed renewals (safe-until moving) since "mark"
//	STALL ms              answer to "gc MB": how long the world stood still
//
// It reads commands from stdin: mark, gap, gc MB.
func raftMemberMain() int {
	dir := os.Getenv(envMember)
	idx := os.Getenv(envIndex)
	tlsCfg, err := certs.Load(certs.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "m"+idx+".pem"), Key: filepath.Join(dir, "m"+idx+"-key.pem")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts := raft.NodeOptions{BindAddr: "127.0.0.1:0", TLS: tlsCfg, Secret: "0123456789abcdef-bench-secret",
		Discovery: filePeers(filepath.Join(dir, "peers")), BootstrapExpect: 3, Voters: 3}
	if s := os.Getenv(envHT); s != "" {
		if opts.HeartbeatTimeout, err = time.ParseDuration(s); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	var cfg backend.Config
	if s := os.Getenv(envTTL); s != "" {
		if cfg.TTL, err = time.ParseDuration(s); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	leases, _ := strconv.Atoi(os.Getenv(envLeases))
	var outMu sync.Mutex
	say := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(format+"\n", a...)
	}
	n, err := raft.StartNode(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	say("ADDR %s", n.Addr())
	<-n.Joined()
	be, err := raft.New(n, raft.Options{Config: cfg})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	// Each lease is held by a goroutine that campaigns again when its term
	// ends; gaps records the longest wait between two renewals.
	var (
		mu    sync.Mutex
		held  = 0
		gap   time.Duration
		terms = make([]baton.Term, leases)
		moved = make([]time.Time, leases) // when terms[i]'s safe-until last moved
		until = make([]time.Time, leases)
	)
	for i := range leases {
		go func() {
			name := fmt.Sprintf("load-m%s-%d", idx, i)
			for {
				t, err := be.Campaign(context.Background(), name, baton.Candidate{ID: "m" + idx})
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				mu.Lock()
				terms[i], moved[i], until[i] = t, time.Now(), t.SafeUntil()
				held++
				if held == leases {
					say("READY")
				}
				mu.Unlock()
				<-t.Done()
				say("LOST %s %v", name, t.Err())
			}
		}()
	}
	// Sample the raft state and the terms' safe-until.
	go func() {
		state := ""
		for {
			if s := n.Status().State; s != state {
				state = s
				say("STATE %s", s)
			}
			now := time.Now()
			mu.Lock()
			for i, t := range terms {
				if t == nil || t.Err() != nil {
					continue
				}
				if su := t.SafeUntil(); su.After(until[i]) {
					gap = max(gap, now.Sub(moved[i]))
					moved[i], until[i] = now, su
				}
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	in := bufio.NewScanner(os.Stdin)
	var ballast [][]*node
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 1 && f[0] == "mark":
			mu.Lock()
			gap = 0
			mu.Unlock()
		case len(f) == 1 && f[0] == "gap":
			mu.Lock()
			g := gap
			mu.Unlock()
			say("GAP %d", g.Milliseconds())
		case len(f) == 2 && f[0] == "gc":
			mb, _ := strconv.Atoi(f[1])
			ballast = append(ballast, allocBurst(mb))
			say("STALL %d", stopTheWorld().Milliseconds())
			ballast = nil
			runtime.GC()
		}
	}
	return 0
}

// node is a heap object with a pointer, so that the collector must trace
// every one of them.
type node struct {
	next *node
	pad  [6]uint64
}

// allocBurst allocates mb MB of linked objects as fast as it can.
func allocBurst(mb int) []*node {
	heads := make([]*node, 0, 1024)
	per := (1 << 20) / 64
	for range mb {
		var h *node
		for range per {
			h = &node{next: h}
		}
		heads = append(heads, h)
	}
	return heads
}

// stopTheWorld stops every goroutine of the process for as long as writing
// a heap dump of the live heap takes (debug.WriteHeapDump stops the world
// throughout), as a long garbage-collector pause would, and returns how
// long that was.
func stopTheWorld() time.Duration {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	start := time.Now()
	debug.WriteHeapDump(f.Fd())
	return time.Since(start)
}

// filePeers is a Discoverer reading one address a line from a file that the
// benchmark writes once every member listens.
type filePeers string

func (p filePeers) Peers(context.Context) ([]string, error) {
	b, err := os.ReadFile(string(p))
	if err != nil {
		return nil, nil
	}
	return strings.Fields(string(b)), nil
}

// memberProc is a raft member process started by the benchmark.
type memberProc struct {
	cmd   *exec.Cmd
	stdin io.Writer
	addr  chan string
	ready chan struct{}
	stall chan time.Duration
	gap   chan time.Duration
}

// loadEvent is a line a member printed, with when the benchmark read it.
type loadEvent struct {
	at     time.Time
	member int
	kind   string // STATE, LOST
	arg    string
}

// loadGroup is a three-voter group of member processes.
type loadGroup struct {
	members []*memberProc
	mu      sync.Mutex
	events  []loadEvent
	state   []string // each member's last reported raft state
}

func (g *loadGroup) record(i int, kind, arg string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.events = append(g.events, loadEvent{time.Now(), i, kind, arg})
	if kind == "STATE" {
		g.state[i] = arg
	}
}

// startLoadGroup starts three member processes with the given heartbeat
// timeout and TTL ("" for the defaults) and waits until each holds its
// leases and one of them is raft leader.
func startLoadGroup(b *testing.B, ht, ttl string) *loadGroup {
	b.Helper()
	dir := b.TempDir()
	ca, err := certs.NewCA("baton bench CA", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	if err := ca.WriteCert(filepath.Join(dir, "ca.pem")); err != nil {
		b.Fatal(err)
	}
	g := &loadGroup{state: make([]string, 3)}
	var addrs []string
	for i := range 3 {
		cert, key, err := ca.Issue(fmt.Sprintf("m%d", i), []string{"127.0.0.1"}, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := certs.WritePair(filepath.Join(dir, fmt.Sprintf("m%d.pem", i)), filepath.Join(dir, fmt.Sprintf("m%d-key.pem", i)), cert, key); err != nil {
			b.Fatal(err)
		}
		m := &memberProc{addr: make(chan string, 1), ready: make(chan struct{}), stall: make(chan time.Duration, 1), gap: make(chan time.Duration, 1)}
		m.cmd = exec.Command(os.Args[0], "-test.run", "^$")
		m.cmd.Env = append(os.Environ(), envMember+"="+dir, envIndex+"="+strconv.Itoa(i), envHT+"="+ht, envTTL+"="+ttl, envLeases+"="+strconv.Itoa(loadLeases))
		m.cmd.Stderr = os.Stderr
		m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := m.cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if m.stdin, err = m.cmd.StdinPipe(); err != nil {
			b.Fatal(err)
		}
		if err := m.cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = m.cmd.Process.Signal(syscall.SIGCONT)
			_ = m.cmd.Process.Kill()
			_ = m.cmd.Wait()
		})
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				kind, arg, _ := strings.Cut(sc.Text(), " ")
				switch kind {
				case "ADDR":
					m.addr <- arg
				case "READY":
					close(m.ready)
				case "STALL", "GAP":
					ms, _ := strconv.Atoi(arg)
					map[string]chan time.Duration{"STALL": m.stall, "GAP": m.gap}[kind] <- time.Duration(ms) * time.Millisecond
				default:
					g.record(i, kind, arg)
				}
			}
		}()
		g.members = append(g.members, m)
		select {
		case a := <-m.addr:
			addrs = append(addrs, a)
		case <-time.After(time.Minute):
			b.Fatalf("member %d did not start", i)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "peers"), []byte(strings.Join(addrs, "\n")), 0o644); err != nil {
		b.Fatal(err)
	}
	for i, m := range g.members {
		select {
		case <-m.ready:
		case <-time.After(time.Minute):
			b.Fatalf("member %d holds no leases a minute after the start", i)
		}
	}
	g.leader(b)
	return g
}

// leader returns the index of the member that reports itself raft leader,
// waiting until exactly one does.
func (g *loadGroup) leader(b *testing.B) int {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		g.mu.Lock()
		var l []int
		for i, s := range g.state {
			if s == "Leader" {
				l = append(l, i)
			}
		}
		g.mu.Unlock()
		if len(l) == 1 {
			return l[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatal("no single raft leader a minute after the start")
	return -1
}

// send writes a command to every member (i < 0) or to member i.
func (g *loadGroup) send(i int, cmd string) {
	for j, m := range g.members {
		if i < 0 || i == j {
			_, _ = io.WriteString(m.stdin, cmd+"\n")
		}
	}
}

// maxGap asks every member for its longest wait between two confirmed
// renewals since the last mark.
func (g *loadGroup) maxGap(b *testing.B) time.Duration {
	b.Helper()
	var longest time.Duration
	for i, m := range g.members {
		g.send(i, "gap")
		select {
		case d := <-m.gap:
			longest = max(longest, d)
		case <-time.After(time.Minute):
			b.Fatalf("member %d does not answer", i)
		}
	}
	return longest
}

// window counts what the members reported since from: terms lost, and
// members that became raft leader, with the first of them; why is the
// reason of each kind of loss, with its count.
func (g *loadGroup) window(from time.Time) (lost, elections int, firstElected time.Time, why map[string]int) {
	why = map[string]int{}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.events {
		if e.at.Before(from) {
			continue
		}
		switch {
		case e.kind == "LOST":
			lost++
			_, reason, _ := strings.Cut(e.arg, " ")
			if i := strings.Index(reason, ": session "); i > 0 {
				reason = reason[:i] // the rest names the session
			}
			why[reason]++
		case e.kind == "STATE" && e.arg == "Leader":
			elections++
			if firstElected.IsZero() {
				firstElected = e.at
			}
		}
	}
	return lost, elections, firstElected, why
}

// startHog starts a process that keeps n threads busy, killed when stop is
// called.
func startHog(b *testing.B, n int) (stop func()) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), envHog+"="+strconv.Itoa(n))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	b.Cleanup(stop)
	return stop
}

// BenchmarkRaftUnderLoad: a group of three raft member processes (this
// test binary run as a member: a Node and a Backend, as `baton run
// --backend raft://` has), each holding 10 leases of its own, under a fault
// per iteration, at the default timings (default) and at the given older
// ones. A fault:
//
//   - hog: a process beside the members keeps twice as many threads busy as
//     there are cores, for 10 s;
//   - stop=D: the raft leader's process is stopped with SIGSTOP for D, then
//     continued, as a stalled or descheduled host would stop it;
//   - gc: the raft leader's process allocates 256 MB of linked objects as
//     fast as it can (its collector runs beside the raft code), then stops
//     the world for as long as writing a heap dump of that heap takes
//     (stall-ms, about a second on a busy two-core machine), as a long
//     collector pause would.
//
// Each fault is followed by a settling time of a TTL and a second, so that
// a term that it cost ends within the window. Reported: lost/fault, the
// terms that ended (of 30 held); elections/fault, the members that became
// raft leader; renew-gap-max-ms, the longest time any member went between
// two confirmed renewals (a term ends when this exceeds its renewal
// window, TTL − renew interval − drift margin); election-ms, from the fault
// to the first new raft leader, in the iterations that had one.
func BenchmarkRaftUnderLoad(b *testing.B) {
	configs := []struct{ name, ht, ttl string }{
		{"default", "", ""},
		{"ht=500ms,ttl=2s", "500ms", "2s"},
	}
	// At the small size (benchci), the faster configuration alone: both
	// run the same code, and its shorter TTL settles sooner.
	configs = benchci.Size(configs, configs[1:])
	faults := []struct {
		name string
		stop time.Duration
	}{{"hog", 0}, {"stop=100ms", 100 * time.Millisecond}, {"stop=300ms", 300 * time.Millisecond},
		{"stop=500ms", 500 * time.Millisecond}, {"stop=1s", time.Second}, {"gc", 0}}
	// BATON_BENCH_RAFT_CONFIGS replaces the configurations: "default" or
	// "ht=D,ttl=D", separated by semicolons.
	if only := os.Getenv("BATON_BENCH_RAFT_CONFIGS"); only != "" {
		configs = configs[:0]
		for _, name := range strings.Split(only, ";") {
			c := struct{ name, ht, ttl string }{name: name}
			for _, kv := range strings.Split(name, ",") {
				switch k, v, _ := strings.Cut(kv, "="); k {
				case "ht":
					c.ht = v
				case "ttl":
					c.ttl = v
				}
			}
			configs = append(configs, c)
		}
	}
	for _, c := range configs {
		for _, f := range faults {
			b.Run(c.name+"/"+f.name, func(b *testing.B) {
				g := startLoadGroup(b, c.ht, c.ttl)
				ttl := raft.DefaultTTL
				if c.ttl != "" {
					ttl, _ = time.ParseDuration(c.ttl)
				}
				var (
					lost, elections, faultsRun int
					gap                        time.Duration
					electionTimes              []time.Duration
					stalls                     []time.Duration
				)
				for b.Loop() {
					leader := g.leader(b)
					g.send(-1, "mark")
					start := time.Now()
					switch {
					case f.name == "hog":
						stop := startHog(b, 2*runtime.NumCPU())
						time.Sleep(benchci.Size(10*time.Second, time.Second)) // the fault itself
						stop()
					case f.name == "gc":
						g.send(leader, fmt.Sprintf("gc %d", benchci.Size(256, 16)))
						select {
						case d := <-g.members[leader].stall:
							stalls = append(stalls, d)
						case <-time.After(2 * time.Minute):
							b.Fatal("the raft leader's member did not report its stall")
						}
					default:
						p := g.members[leader].cmd.Process
						_ = p.Signal(syscall.SIGSTOP)
						time.Sleep(f.stop) // the fault itself
						_ = p.Signal(syscall.SIGCONT)
					}
					time.Sleep(ttl + time.Second) // the settling window in which a lost term would end
					l, e, first, why := g.window(start)
					lost += l
					elections += e
					if e > 0 {
						electionTimes = append(electionTimes, first.Sub(start))
					}
					gap = max(gap, g.maxGap(b))
					faultsRun++
					b.Logf("%s: lost %d %v, elections %d, longest renewal gap so far %v", f.name, l, why, e, gap)
				}
				b.ReportMetric(float64(lost)/float64(faultsRun), "lost/fault")
				b.ReportMetric(float64(elections)/float64(faultsRun), "elections/fault")
				b.ReportMetric(float64(gap.Milliseconds()), "renew-gap-max-ms")
				if len(electionTimes) > 0 {
					report(b, electionTimes, "election")
				}
				if len(stalls) > 0 {
					report(b, stalls, "stall")
				}
			})
		}
	}
}
