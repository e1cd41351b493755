package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The request-rate comparison: baton's `baton run` against the peer's own
// tool (`etcdctl lock`, Curator's LeaderLatch, `consul lock`) on one server
// in one run, each as one holder and two standbys, every process reaching
// the server through a proxy of its own that counts its requests by type as
// the server receives them. The trios of one server run at the same time,
// each on a lease of its own: none reads or watches another's keys, so none
// adds to another's counts, and every figure comes from the same window.

var (
	// peerWarmUp is left out of the measurement after every process
	// contends: start-up requests (connect, grant, create) are not the
	// steady state.
	peerWarmUp = benchci.Size(5*time.Second, time.Second)
	// peerWindow is one measurement: long enough for several renewals at
	// the longest TTL compared here (Curator's, 30 s as granted).
	peerWindow = benchci.Size(60*time.Second, 2*time.Second)
)

// roles are the processes of a trio, in the order they start.
var roles = []string{"holder", "standby-1", "standby-2"}

// trioSpec is one tool at one TTL.
type trioSpec struct {
	tool string // "baton", "etcdctl lock", ...
	ttl  string // what TTL the processes use, and whether it is the tool's default
	// start starts the process id contending for lease through addr (its
	// proxy); the process prints "MICROS LEADER id" when it starts to hold
	// the lease and "MICROS END id" (or LatchMain's NOTLEADER, RESIGNING)
	// when it stops, MICROS being microseconds since the epoch.
	start func(b *testing.B, addr, lease, id string) *exec.Cmd
}

// metric names the trio's figure: the tool and the first duration in its
// TTL description ("baton@2s-req/s/proc").
func (s trioSpec) metric() string {
	ttl := "?"
	for _, f := range strings.Fields(s.ttl) {
		if _, err := time.ParseDuration(f); err == nil {
			ttl = f
			break
		}
	}
	return strings.ReplaceAll(s.tool, " ", "-") + "@" + ttl + "-req/s/proc"
}

// peerBackend is one server and the trios compared on it.
type peerBackend struct {
	target string // the server's address
	tap    func(*reqCounter) func() io.Writer
	// contenders returns how many processes of the trio of spec on lease
	// contend (hold or queue), as the server sees it.
	contenders func(spec trioSpec, lease string) (int, error)
	trios      []trioSpec
}

// peerProc is one process of a trio.
type peerProc struct {
	role, id string
	cmd      *exec.Cmd
	counter  *reqCounter
	out      *testserver.SyncBuffer
	led      atomic.Int32 // LEADER lines printed
	tl       *timeline
	exited   chan struct{}
}

type trio struct {
	spec  trioSpec
	lease string
	procs []*peerProc
	tl    timeline
}

// timeline is who led a trio's lease when, as its processes said. Safe for
// concurrent use.
type timeline struct {
	mu  sync.Mutex
	evs []leaderEvent
}

type leaderEvent struct {
	at    int64 // microseconds since the epoch, on the process's clock (this machine's)
	start bool
	id    string
}

func (tl *timeline) add(ev leaderEvent) {
	tl.mu.Lock()
	tl.evs = append(tl.evs, ev)
	tl.mu.Unlock()
}

// check returns how many times the leader changed, and an error if two
// processes ever led at once or nobody leads at the end.
func (tl *timeline) check() (changes int, err error) {
	tl.mu.Lock()
	evs := slices.Clone(tl.evs)
	tl.mu.Unlock()
	slices.SortStableFunc(evs, func(a, b leaderEvent) int { return cmp.Compare(a.at, b.at) })
	leading := ""
	for i, ev := range evs {
		switch {
		case ev.start && leading != "" && leading != ev.id:
			return changes, fmt.Errorf("%s started leading at %s while %s led", ev.id, time.UnixMicro(ev.at).Format("15:04:05.000000"), leading)
		case ev.start:
			if i > 0 {
				changes++
			}
			leading = ev.id
		case ev.id == leading:
			leading = ""
		}
	}
	if leading == "" {
		return changes, errors.New("nobody leads at the end")
	}
	return changes, nil
}

// childScript is what every holder runs: it says when it starts and stops
// leading (on SIGTERM, which every tool sends when the lease is lost or it
// stops) in LatchMain's format, and idles in between.
const childScript = `now() { echo $(( $(date +%s%N) / 1000 )); }
echo "$(now) LEADER $1"
sleep 1000000 &
trap 'echo "$(now) END $1"; kill $! 2>/dev/null; exit 0' TERM INT
wait $!
`

// writeChild writes childScript to a file, to be run as `sh FILE ID`.
func writeChild(b *testing.B) string {
	b.Helper()
	f := filepath.Join(b.TempDir(), "child.sh")
	if err := os.WriteFile(f, []byte(childScript), 0o644); err != nil {
		b.Fatal(err)
	}
	return f
}

// cleanEnv is this process's environment without the variables that would
// point a tool elsewhere (BATON_*, CONSUL_*, ETCDCTL_*).
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BATON_") && !strings.HasPrefix(kv, "CONSUL_") && !strings.HasPrefix(kv, "ETCDCTL_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// buildBaton builds cmd/baton from this repository, in its own directory,
// so that it builds from this checkout's code whether cmd/baton is a
// package of this module or a module of its own.
func buildBaton(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "baton")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "cmd", "baton")
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("go build baton: %v\n%s", err, out)
	}
	return bin
}

// shortTriosWhenSmall returns trios, or at the small size (benchci) its
// first two, at TTL 2 s: the trios at a longer TTL run the same code, and
// renew less often than the small window lasts.
func shortTriosWhenSmall(trios []trioSpec) []trioSpec { return benchci.Size(trios, trios[:2]) }

// batonTrio is `baton run` with the backend URL url(addr), at ttl ("" for
// the default), running the child script.
func batonTrio(bin, child, ttl, ttlDesc string, url func(addr string) string) trioSpec {
	return trioSpec{tool: "baton", ttl: ttlDesc, start: func(b *testing.B, addr, lease, id string) *exec.Cmd {
		args := []string{"run", "--backend", url(addr), "--lease", lease, "--id", id, "--log-level", "warn"}
		if ttl != "" {
			args = append(args, "--ttl", ttl)
		}
		cmd := exec.Command(bin, append(args, "--", "sh", child, id)...)
		cmd.Env = cleanEnv()
		return cmd
	}}
}

// startProc starts one process of t behind a counting proxy to target.
func startProc(b *testing.B, pb *peerBackend, t *trio, role string) *peerProc {
	b.Helper()
	p := &peerProc{role: role, id: role, counter: newReqCounter(), out: new(testserver.SyncBuffer), tl: &t.tl, exited: make(chan struct{})}
	proxy := testserver.StartProxy(b, pb.target)
	proxy.TapClient(pb.tap(p.counter))
	p.cmd = t.spec.start(b, proxy.Addr(), t.lease, p.id)
	p.cmd.Stderr = p.out
	p.cmd.Stdout = &leaderLines{p: p}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A child left behind (consul lock's, in a process group of its own)
	// may hold stdout open: Wait does not wait for it.
	p.cmd.WaitDelay = time.Second
	if err := p.cmd.Start(); err != nil {
		b.Fatalf("start %s %s: %v", t.spec.tool, role, err)
	}
	go func() {
		defer close(p.exited)
		_ = p.cmd.Wait()
	}()
	b.Cleanup(func() { p.stop(b) })
	return p
}

// leaderLines copies a process's output to its log and records its
// "MICROS LEADER id" and "MICROS END id" lines (LatchMain's NOTLEADER and
// RESIGNING end a leadership too) on its trio's timeline.
type leaderLines struct {
	p    *peerProc
	line []byte
}

func (w *leaderLines) Write(b []byte) (int, error) {
	w.line = append(w.line, b...)
	for {
		i := bytes.IndexByte(w.line, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := string(w.line[:i])
		w.line = w.line[i+1:]
		fmt.Fprintln(w.p.out, line)
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != w.p.id {
			continue
		}
		at, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch f[1] {
		case "LEADER":
			w.p.tl.add(leaderEvent{at: at, start: true, id: w.p.id})
			w.p.led.Add(1)
		case "END", "NOTLEADER", "RESIGNING":
			w.p.tl.add(leaderEvent{at: at, id: w.p.id})
		}
	}
}

// stop asks the process to exit (SIGTERM: baton resigns, the CLIs release)
// and kills its process group if it has not within 10 s.
func (p *peerProc) stop(b *testing.B) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		b.Logf("%s did not exit within 10s of SIGTERM; killing it", p.id)
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// total is the sum of counts over every request type (h2Ping is not one).
func total(counts map[string]int64) (n int64) {
	for k, c := range counts {
		if k != h2Ping {
			n += c
		}
	}
	return n
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(b *testing.B, d time.Duration, what string, cond func() (bool, error)) {
	b.Helper()
	var last error
	if !testkit.Poll(d, 100*time.Millisecond, func() bool {
		ok, err := cond()
		last = err
		return ok
	}) {
		b.Fatalf("%s: not within %s (last error: %v)", what, d, last)
	}
}

// comparePeers starts every trio of pb (holder first; the standbys once it
// leads), waits until all of them contend, and then measures each
// process's requests over peerWindow per iteration. It fails if a trio
// ever had another leader than its holder, or a process made no request.
func comparePeers(b *testing.B, pb *peerBackend) {
	base := fmt.Sprintf("reqs-%d", time.Now().UnixNano())
	trios := make([]*trio, len(pb.trios))
	for i, spec := range pb.trios {
		t := &trio{spec: spec, lease: fmt.Sprintf("%s-%d", base, i)}
		trios[i] = t
		holder := startProc(b, pb, t, roles[0])
		t.procs = append(t.procs, holder)
		waitFor(b, 60*time.Second, spec.tool+" "+spec.ttl+": the holder leads", func() (bool, error) {
			select {
			case <-holder.exited:
				b.Fatalf("%s holder exited:\n%s", spec.tool, holder.out)
			default:
			}
			return holder.led.Load() > 0, nil
		})
		for _, role := range roles[1:] {
			t.procs = append(t.procs, startProc(b, pb, t, role))
		}
	}
	for _, t := range trios {
		waitFor(b, 60*time.Second, t.spec.tool+" "+t.spec.ttl+": three contenders", func() (bool, error) {
			n, err := pb.contenders(t.spec, t.lease)
			return n == len(roles), err
		})
	}
	time.Sleep(peerWarmUp) // left out of the measurement, not synchronisation

	before := make([][]map[string]int64, len(trios))
	after := make([][]map[string]int64, len(trios))
	snap := func(into [][]map[string]int64) {
		for i, t := range trios {
			into[i] = nil
			for _, p := range t.procs {
				into[i] = append(into[i], p.counter.snapshot())
			}
		}
	}
	snap(before)
	start := time.Now()
	for b.Loop() {
		time.Sleep(peerWindow) // the measurement window itself
	}
	snap(after)
	secs := time.Since(start).Seconds()

	var table strings.Builder
	fmt.Fprintf(&table, "\n| tool | TTL | process | request type | requests | req/s |\n|---|---|---|---|---:|---:|\n")
	var summary strings.Builder
	fmt.Fprintf(&summary, "\n| tool | TTL | holder | standby-1 | standby-2 | per process | leader changes |\n|---|---|---:|---:|---:|---:|---:|\n")
	for i, t := range trios {
		var sum int64
		rates := make([]string, len(t.procs))
		for j, p := range t.procs {
			if err := p.counter.err(); err != nil {
				b.Errorf("%s %s %s: its requests could not be counted: %v", t.spec.tool, t.spec.ttl, p.role, err)
			}
			delta := map[string]int64{}
			for k, v := range after[i][j] {
				if d := v - before[i][j][k]; d > 0 {
					delta[k] = d
				}
			}
			n := total(delta)
			sum += n
			rates[j] = fmt.Sprintf("%.2f", float64(n)/secs)
			// At the small size (benchci) the window can be shorter than
			// a renewal interval (Consul's sessions: 15 s).
			if n == 0 && !benchci.Small() {
				b.Errorf("%s %s %s made no request in %.0f s", t.spec.tool, t.spec.ttl, p.role, secs)
			}
			for _, k := range slices.Sorted(maps.Keys(delta)) {
				fmt.Fprintf(&table, "| %s | %s | %s | %s | %d | %.2f |\n", t.spec.tool, t.spec.ttl, p.role, k, delta[k], float64(delta[k])/secs)
			}
			select {
			case <-p.exited:
				b.Errorf("%s %s %s exited during the run:\n%s", t.spec.tool, t.spec.ttl, p.role, p.out)
			default:
			}
		}
		if n, err := pb.contenders(t.spec, t.lease); err != nil || n != len(roles) {
			b.Errorf("%s %s: %d contenders at the end (%v); want %d", t.spec.tool, t.spec.ttl, n, err, len(roles))
		}
		// Exactly one holder at a time, always. A hand-over (renewals that
		// lagged on a loaded machine, say) is allowed, and shown: the
		// figures then include a campaign or two.
		changes, err := t.tl.check()
		if err != nil {
			b.Errorf("%s %s: %v", t.spec.tool, t.spec.ttl, err)
		}
		perProc := float64(sum) / secs / float64(len(t.procs))
		fmt.Fprintf(&summary, "| %s | %s | %s | %.2f | %d |\n", t.spec.tool, t.spec.ttl, strings.Join(rates, " | "), perProc, changes)
		b.ReportMetric(perProc, t.spec.metric())
	}
	b.Logf("requests per process per second over %.0f s, 1 holder + 2 standbys each, one server:%s%s", secs, summary.String(), table.String())
	if b.Failed() {
		for _, t := range trios {
			for _, p := range t.procs {
				b.Logf("%s %s %s output:\n%s", t.spec.tool, t.spec.ttl, p.role, p.out)
			}
		}
	}
}

// BenchmarkRequestsVsEtcdctl: requests per process per second of `baton
// run` and of `etcdctl lock` (Debian's etcd-client), 1 holder + 2 standbys
// each, against one embedded etcd, at TTL 2 s and at the default (10 s for
// both). Counted: gRPC messages from client to server, each keep-alive on
// the LeaseKeepAlive stream included.
func BenchmarkRequestsVsEtcdctl(b *testing.B) {
	etcdctl, err := exec.LookPath("etcdctl")
	if err != nil {
		testserver.Unavailable(b, "etcdctl", fmt.Errorf("%w (Debian: apt-get install etcd-client)", err))
	}
	srv := testserver.StartEtcd(b)
	bin, child := buildBaton(b), writeChild(b)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	url := func(addr string) string { return "etcd://" + addr }
	lock := func(ttl string) func(b *testing.B, addr, lease, id string) *exec.Cmd {
		return func(b *testing.B, addr, lease, id string) *exec.Cmd {
			args := []string{"--endpoints=" + addr, "lock"}
			if ttl != "" {
				args = append(args, "--ttl="+ttl)
			}
			cmd := exec.Command(etcdctl, append(args, "--", lease, "sh", child, id)...)
			cmd.Env = cleanEnv("ETCDCTL_API=3")
			return cmd
		}
	}
	comparePeers(b, &peerBackend{
		target: strings.TrimPrefix(srv.Endpoint(), "http://"),
		tap:    grpcTap,
		contenders: func(_ trioSpec, lease string) (int, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := cli.Get(ctx, lease+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return int(resp.Count), nil
		},
		trios: shortTriosWhenSmall([]trioSpec{
			batonTrio(bin, child, "2s", "2s", url),
			{tool: "etcdctl lock", ttl: "2s", start: lock("2")},
			batonTrio(bin, child, "", "10s (default)", url),
			{tool: "etcdctl lock", ttl: "10s (default)", start: lock("")},
		}),
	})
}

// BenchmarkRequestsVsCurator: requests per process per second of `baton
// run` and of Apache Curator's LeaderLatch (Debian's Curator 5.4, the
// interop test's LatchMain in quiet mode), 1 holder + 2 standbys each, on
// one latch path per trio. standalone: one ZooKeeper 3.8 server, at session
// timeout 2 s and at the defaults (baton 10 s; Curator asks 60 s, which
// this server, like any with maxSessionTimeout below it, lowers to its
// maximum, 30 s). ensemble: every process connected to the same follower
// of a 3-server ensemble, at session timeout 2 s. Counted: request
// packets, pings included, and the four-letter words baton's probe asks.
func BenchmarkRequestsVsCurator(b *testing.B) {
	java, classPath := testserver.CompileCurator(b, filepath.Join("..", "backend", "zookeeper", "testdata", "LatchMain.java"))
	bin, child := buildBaton(b), writeChild(b)
	const root = "/reqs"
	url := func(addr string) string { return "zk://" + addr + root }
	latch := func(session time.Duration) func(b *testing.B, addr, lease, id string) *exec.Cmd {
		return func(b *testing.B, addr, lease, id string) *exec.Cmd {
			args := append(slices.Clone(testserver.JavaQuickStart),
				"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classPath,
				"LatchMain", addr, root+"/"+lease, id, strconv.Itoa(int(session/time.Millisecond)), "quiet")
			cmd := exec.Command(java, args...)
			// LatchMain exits at the end of its input: give it one that
			// stays open.
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { w.Close(); r.Close() })
			cmd.Stdin = r
			return cmd
		}
	}
	contenders := func(b *testing.B, servers []string) func(trioSpec, string) (int, error) {
		conn, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogger(quietZK{}))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(conn.Close)
		return func(_ trioSpec, lease string) (int, error) {
			kids, _, err := conn.Children(root + "/" + lease)
			if err == zk.ErrNoNode {
				return 0, nil
			}
			return len(kids), err
		}
	}
	b.Run("standalone", func(b *testing.B) {
		srv := testserver.StartZooKeeper(b, testserver.ZooKeeperOptions{})
		granted := min(60*time.Second, testserver.ZooKeeperMaxSessionTimeout)
		comparePeers(b, &peerBackend{
			target:     srv.Addr(),
			tap:        zkTap,
			contenders: contenders(b, []string{srv.Addr()}),
			trios: shortTriosWhenSmall([]trioSpec{
				batonTrio(bin, child, "2s", "2s", url),
				{tool: "Curator LeaderLatch", ttl: "2s", start: latch(2 * time.Second)},
				batonTrio(bin, child, "", "10s (default)", url),
				{tool: "Curator LeaderLatch", ttl: fmt.Sprintf("%s (default 60s, granted %s)", granted, granted), start: latch(60 * time.Second)},
			}),
		})
	})
	b.Run("ensemble", func(b *testing.B) {
		ens := testserver.StartZooKeeperEnsemble(b, 3)
		follower := ens.Addrs()[(ens.LeaderIndex()+1)%ens.Len()]
		comparePeers(b, &peerBackend{
			target:     follower,
			tap:        zkTap,
			contenders: contenders(b, ens.Addrs()),
			trios: []trioSpec{
				batonTrio(bin, child, "2s", "2s", url),
				{tool: "Curator LeaderLatch", ttl: "2s", start: latch(2 * time.Second)},
			},
		})
	})
}

// BenchmarkRequestsVsConsulLock: requests per process per second of `baton
// run` and of `consul lock` (the consul binary the tests build), 1 holder
// + 2 standbys each, against one Consul agent. Consul's session TTL is what
// the two share: `consul lock` asks 15 s, which it does not let one change;
// baton asks TTL/2 (Consul may take up to twice the session TTL to expire
// a session), so baton --ttl 30s asks the same 15 s, and baton's default
// TTL of 20 s asks 10 s. Counted: HTTP requests; a blocking query counts
// once.
func BenchmarkRequestsVsConsulLock(b *testing.B) {
	srv := testserver.StartConsul(b, testserver.ConsulOptions{})
	bin, child := buildBaton(b), writeChild(b)
	client, err := api.NewClient(&api.Config{Address: srv.Addr()})
	if err != nil {
		b.Fatal(err)
	}
	const prefix, lockSession = "reqs", "reqs-consul-lock"
	url := func(addr string) string { return "consul://" + addr + "/" + prefix }
	lock := func(b *testing.B, addr, lease, id string) *exec.Cmd {
		cmd := exec.Command(srv.Binary(), "lock", "-http-addr="+addr, "-name="+lockSession, prefix+"/"+lease, "sh "+child+" "+id)
		cmd.Env = cleanEnv()
		return cmd
	}
	// sessionTTLs are the session TTLs of the trios, in order.
	sessionTTLs := []time.Duration{10 * time.Second, 15 * time.Second, 15 * time.Second}
	trios := []trioSpec{
		batonTrio(bin, child, "", "20s (default; session TTL 10s)", url),
		batonTrio(bin, child, "30s", "30s (session TTL 15s)", url),
		{tool: "consul lock", ttl: "session TTL 15s (default, fixed)", start: lock},
	}
	comparePeers(b, &peerBackend{
		target: srv.Addr(),
		tap:    httpTap,
		// Every contender has a session of its own: baton's are named
		// "baton" and told apart by their TTL, the CLI's are named here.
		contenders: func(spec trioSpec, _ string) (int, error) {
			i := slices.IndexFunc(trios, func(t trioSpec) bool { return t.tool == spec.tool && t.ttl == spec.ttl })
			name := "baton"
			if spec.tool != "baton" {
				name = lockSession
			}
			ss, _, err := client.Session().List(&api.QueryOptions{})
			n := 0
			for _, s := range ss {
				if ttl, _ := time.ParseDuration(s.TTL); s.Name == name && ttl == sessionTTLs[i] {
					n++
				}
			}
			return n, err
		},
		trios: trios,
	})
}
