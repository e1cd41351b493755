package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BenchmarkTenThousandCandidates: many candidates for one lease, spread
// over worker processes (this test binary run as a worker, see TestMain),
// each process holding its share of candidates on one Backend of its own,
// as that many instances of a service would. Every worker reaches the
// server through a proxy of its own that counts its requests by type as the
// server receives them (the taps of reqcount_test.go), so killing a worker
// with SIGKILL is a real crash: its connections close, its sessions are
// left to expire.
//
// A Backend's candidates for one lease take turns in the process: on the
// session backends (etcd, ZooKeeper, ...) the store sees one session and
// one campaign (a key, a node) per process, whatever its number of
// candidates; a hand-over wakes the next process waiting in the store, and
// the resigner's next candidate enters the store's queue at its back. On
// the memory backend each "process" is one RecordBackend in this process,
// with a connection of its own to one store.
//
// Each iteration makes candHandOvers graceful hand-overs (the holder
// resigns and campaigns again, at the back of the queue) and one crash
// failover (the holder's whole process is killed, and a new process with
// as many candidates replaces it). Reported:
//
//   - handover-p50-ms, handover-p99-ms: from the holder's Resign to the
//     next holder's Campaign returning (wall clock of one host);
//   - failover-max-ms, bound-ms: from SIGKILL to the next holder, and
//     TTL + one renew interval, the bound the failover must stay within;
//   - procs-active/handover: worker processes that sent the server
//     requests beyond their steady state during a hand-over (see
//     excess): the resigner's and the winner's, 1 or 2, when one waiter
//     wakes; every process in a herd;
//   - req/handover: requests all workers sent beyond the steady state
//     during a hand-over, by the leading request types in the log;
//   - req/s/proc, req/s/candidate: the steady-state rate of a waiting
//     worker (sessions renewed, watches re-armed, polls), and per
//     candidate;
//   - served-req/s, served-req/handover (raft): the same, counted where
//     the raft leader serves the workers' calls;
//   - in the log: requests by type, and what the server reports holding
//     (watches, connections, subscribers) where it reports it.
//
// Exactly one candidate wins each hand-over and each failover, with a
// higher token, and none in a killed process: the benchmark fails
// otherwise. The size is candidatesSize's; run at 10,000 by hand:
//
//	go test -run '^$' -bench TenThousandCandidates -benchtime 3x -timeout 60m -v ./bench
func BenchmarkTenThousandCandidates(b *testing.B) {
	procs, per, ttl := candidatesSize(b)
	for _, cb := range candBackends {
		b.Run(cb.name, func(b *testing.B) { runCandidates(b, cb, procs, per, ttl) })
	}
}

// candidatesSize returns how many worker processes
// BenchmarkTenThousandCandidates starts, how many candidates each holds,
// and their TTL: 10 × 1,000 by default, BATON_BENCH_CANDIDATES=PROCSxPER
// (e.g. 2x10) for another size, and 2 × 10 with -short or
// BATON_BENCH_SMALL=1, the size at which CI runs it to check that it still
// works (internal/benchci sets that variable). The TTL is baton's default,
// 10 s, from 1,000 candidates up, so that that many sessions renewing on a
// busy two-core machine keep up; 3 s below, so that a small run is quick.
func candidatesSize(tb testing.TB) (procs, per int, ttl time.Duration) {
	procs, per = 10, 1000
	if s := os.Getenv("BATON_BENCH_CANDIDATES"); s != "" {
		p, n, ok := strings.Cut(s, "x")
		var err1, err2 error
		procs, err1 = strconv.Atoi(p)
		per, err2 = strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil || procs < 2 || per < 1 {
			tb.Fatalf("BATON_BENCH_CANDIDATES=%q: want PROCSxPER with at least 2 processes, e.g. 10x1000", s)
		}
	} else if testing.Short() || os.Getenv("BATON_BENCH_SMALL") == "1" {
		procs, per = 2, 10
	}
	ttl = 3 * time.Second
	if procs*per >= 1000 {
		ttl = backend.DefaultTTL
	}
	return procs, per, ttl
}

const (
	// candStartPace is the time between the starts of two candidates of a
	// worker: 40 a second per process, 400 for ten.
	candStartPace = 25 * time.Millisecond
	// candHandOvers is how many graceful hand-overs an iteration makes.
	candHandOvers = 10
	// candSettle is how long after a hand-over the workers' requests are
	// still counted as its own: a herd's losers retry after the winner
	// is known.
	candSettle = 250 * time.Millisecond
	// candHang bounds every wait for a worker: a hang, not a figure.
	candHang = 3 * time.Minute
	// envCandWorker makes the test binary a candidate worker (see TestMain):
	// its value is the worker's candSpec in JSON.
	envCandWorker = "BATON_BENCH_CANDIDATES_WORKER"
)

// candSpec tells a worker what to run.
type candSpec struct {
	Backend string        // a candBackend's name
	Addr    string        // the server, through the worker's own proxy
	Lease   string        // the one lease every candidate campaigns for
	Proc    int           // the worker's number, in candidate IDs
	N       int           // candidates in the worker
	TTL     time.Duration // the candidates' TTL
	DSN     string        // PostgreSQL: the database's URL (its host is replaced by Addr)
	Dir     string        // raft: the directory of the CA certificate and the peers file
	Cert    string        // raft: the worker's certificate and key, less -key.pem or .pem
}

// candServer is a started server for the workers.
type candServer struct {
	addr string // what each worker's proxy forwards to
	// tap counts a worker's requests by type; nil for an in-process worker.
	tap func(*reqCounter) func() io.Writer
	// watches reports what the server holds for its waiters; nil where
	// the server does not tell.
	watches func() (string, error)
	// dsn is PostgreSQL's database URL; dir, raft's directory.
	dsn, dir string
	// prepare, if not nil, completes a worker's spec (raft: its
	// certificate).
	prepare func(spec *candSpec) error
	// server, if not nil, counts the requests the server served for all
	// workers together, where a worker's own cannot be tapped (raft).
	server func() map[string]int64
	// inProcess runs a worker in this process instead (memory).
	inProcess func(spec candSpec, reqs *reqCounter) (baton.Backend, func(), error)
}

// candBackend is a backend under BenchmarkTenThousandCandidates.
type candBackend struct {
	name  string
	start func(b *testing.B) candServer
	// backends opens a worker's one Backend, which all its candidates
	// share; close closes what it rides on (clients, connections).
	backends func(spec candSpec) (newBackend func() (baton.Backend, error), close func(), err error)
}

var candBackends = []candBackend{
	{name: "memory", start: candMemory},
	{name: "etcd", start: candEtcd, backends: candEtcdBackends},
	{name: "zookeeper", start: candZooKeeper, backends: candZooKeeperBackends},
}

func candMemory(b *testing.B) candServer {
	store := memory.NewStore()
	return candServer{inProcess: func(spec candSpec, reqs *reqCounter) (baton.Backend, func(), error) {
		conn := store.Connect()
		be, err := backend.NewRecordBackend(kindStore{conn, reqs}, backend.RecordOptions{Config: backend.Config{TTL: spec.TTL}})
		if err != nil {
			return nil, nil, err
		}
		return be, conn.Disconnect, nil
	}}
}

// kindStore counts a RecordStore's requests by type, as a server would.
type kindStore struct {
	*memory.Conn
	reqs *reqCounter
}

func (k kindStore) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	k.reqs.add("Get")
	return k.Conn.Get(ctx, name)
}

func (k kindStore) CompareAndSwap(ctx context.Context, name string, v uint64, r backend.LeaseRecord) (uint64, error) {
	k.reqs.add("CompareAndSwap")
	return k.Conn.CompareAndSwap(ctx, name, v, r)
}

func candEtcd(b *testing.B) candServer {
	srv := testserver.StartEtcd(b)
	return candServer{addr: srv.Endpoint(), tap: grpcTap, watches: func() (string, error) {
		return promGauges("http://"+srv.Endpoint()+"/metrics", "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_watch_stream_total", "etcd_debugging_lease_total")
	}}
}

func candEtcdBackends(spec candSpec) (func() (baton.Backend, error), func(), error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{spec.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, err
	}
	return func() (baton.Backend, error) {
		return etcd.New(cli, etcd.Options{Config: backend.Config{TTL: spec.TTL}})
	}, func() { _ = cli.Close() }, nil
}

func candZooKeeper(b *testing.B) candServer {
	srv := testserver.StartZooKeeper(b, testserver.ZooKeeperOptions{})
	return candServer{addr: srv.Addr(), tap: zkTap, watches: func() (string, error) {
		out, err := srv.FourLetter("mntr")
		if err != nil {
			return "", err
		}
		var got []string
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 2 && (f[0] == "zk_watch_count" || f[0] == "zk_num_alive_connections" || f[0] == "zk_ephemerals_count") {
				got = append(got, f[0]+"="+f[1])
			}
		}
		return strings.Join(got, " "), nil
	}}
}

func candZooKeeperBackends(spec candSpec) (func() (baton.Backend, error), func(), error) {
	var (
		mu    sync.Mutex
		conns []*zk.Conn
	)
	return func() (baton.Backend, error) {
			probe := zookeeper.NewSessionProbe(nil)
			conn, _, err := zk.Connect([]string{spec.Addr}, spec.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quietZK{}))
			if err != nil {
				return nil, err
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			return zookeeper.New(conn, zookeeper.Options{Config: backend.Config{TTL: spec.TTL}, Probe: probe})
		}, func() {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		}, nil
}

// promGauges reads the named metrics from a Prometheus text endpoint.
func promGauges(url string, names ...string) (string, error) {
	out, err := exec.Command("curl", "-fsS", url).Output()
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	var got []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, n := range names {
			if strings.HasPrefix(line, n+" ") {
				got = append(got, strings.Replace(line, " ", "=", 1))
			}
		}
	}
	return strings.Join(got, " "), nil
}

// candidateWorkerMain runs one worker process (see candWorker): spec from
// envCandWorker, commands on stdin, events on stdout.
func candidateWorkerMain() int {
	var spec candSpec
	if err := json.Unmarshal([]byte(os.Getenv(envCandWorker)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, envCandWorker+":", err)
		return 2
	}
	i := slices.IndexFunc(candBackends, func(c candBackend) bool { return c.name == spec.Backend })
	if i < 0 || candBackends[i].backends == nil {
		fmt.Fprintf(os.Stderr, "%s: no worker for backend %q\n", envCandWorker, spec.Backend)
		return 2
	}
	newBackend, closeAll, err := candBackends[i].backends(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeAll()
	runWorker(context.Background(), spec, newBackend, os.Stdin, os.Stdout)
	return 0
}

// runWorker campaigns with spec.N candidates for spec.Lease, all on the one
// Backend newBackend returns, until ctx ends or in closes. A candidate that
// wins holds until told to resign, then campaigns again. It writes, one a
// line:
//
//	READY n                      every candidate has begun to campaign
//	WON id unixnano token        a candidate's Campaign returned
//	RESIGNED unixnano            the holder is about to resign ("resign")
//	NOTHELD                      "resign", but no candidate here holds
//	LOST id err                  a term ended other than by Resign
//	ERR id err                   a Campaign failed (it is retried)
func runWorker(ctx context.Context, spec candSpec, newBackend func() (baton.Backend, error), in io.Reader, out io.Writer) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		outMu sync.Mutex
		mu    sync.Mutex
		held  chan struct{} // closed to make the holder resign; nil while none holds here
		wg    sync.WaitGroup
	)
	say := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, format+"\n", a...)
	}
	be, err := newBackend()
	if err != nil {
		say("ERR p%d %v", spec.Proc, oneLine(err))
		return
	}
	if c, ok := be.(interface{ Close(context.Context) error }); ok {
		defer func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer ccancel()
			_ = c.Close(cctx)
		}()
	}
	started := make(chan struct{}, spec.N)
	for i := range spec.N {
		id := fmt.Sprintf("p%d-c%d", spec.Proc, i)
		if i > 0 {
			// A fleet's instances start over time: all 10,000 sessions
			// and keys requested at once time out on a busy server.
			time.Sleep(candStartPace)
		}
		wg.Go(func() {
			first := true
			for ctx.Err() == nil {
				if first {
					started <- struct{}{}
					first = false
				}
				t, err := be.Campaign(ctx, spec.Lease, baton.Candidate{ID: id})
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					say("ERR %s %v", id, oneLine(err))
					select {
					case <-ctx.Done():
					case <-time.After(time.Second): // a retry's pace, not synchronisation
					}
					continue
				}
				resign := make(chan struct{})
				mu.Lock()
				held = resign
				say("WON %s %d %d", id, time.Now().UnixNano(), t.Token())
				candTraceEvent("WON", "id", id, "token", t.Token())
				mu.Unlock()
				select {
				case <-t.Done():
				case <-resign:
					// Resign returns once the lease is released: only
					// then may this candidate campaign again.
					_ = t.Resign(ctx)
				case <-ctx.Done():
					_ = t.Resign(context.Background())
					return
				}
				mu.Lock()
				if held == resign {
					held = nil
				}
				mu.Unlock()
				if err := t.Err(); !errors.Is(err, baton.ErrResigned) {
					say("LOST %s %v", id, oneLine(err))
				}
			}
		})
	}
	go func() {
		for range spec.N {
			<-started
		}
		say("READY %d", spec.N)
	}()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "resign":
			mu.Lock()
			resign := held
			held = nil
			if resign == nil {
				mu.Unlock()
				say("NOTHELD")
				continue
			}
			say("RESIGNED %d", time.Now().UnixNano())
			candTraceEvent("RESIGNED")
			close(resign)
			mu.Unlock()
		}
	}
	cancel()
	wg.Wait()
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }

// candWorker is a worker as the benchmark sees it.
type candWorker struct {
	idx   int
	stdin io.Writer
	reqs  *reqCounter
	kill  func() // SIGKILL, or the in-process equivalent
	ready chan struct{}
	dead  bool
}

// candEvent is a line a worker wrote, with the worker's number.
type candEvent struct {
	proc  int
	kind  string // WON, RESIGNED, NOTHELD, LOST, ERR
	id    string
	at    time.Time // WON, RESIGNED: the worker's own clock (same host)
	token uint64
	line  string
}

// candRun is one backend's run: its server and its workers.
type candRun struct {
	b       *testing.B
	srv     candServer
	name    string
	lease   string
	per     int
	ttl     time.Duration
	workers []*candWorker
	events  chan candEvent
	errs    map[string]int // ERR and LOST lines, by their error
	errMu   sync.Mutex
}

func runCandidates(b *testing.B, cb candBackend, procs, per int, ttl time.Duration) {
	r := &candRun{b: b, srv: cb.start(b), name: cb.name, lease: fmt.Sprintf("candidates-%d", time.Now().UnixNano()),
		per: per, ttl: ttl, events: make(chan candEvent, 1024), errs: map[string]int{}}
	defer r.logErrs()
	for range procs {
		r.startWorker()
	}
	for _, w := range r.workers {
		r.waitReady(w)
	}
	holder := r.nextWon(nil)
	b.Logf("%s: %d processes × %d candidates campaigning; %s holds", cb.name, procs, per, holder.id)
	// Warm-up: the campaigns' start (sessions, keys, first reads) is not
	// the steady state. Then one renew window of nothing but waiting.
	time.Sleep(ttl)
	steady, window := r.snapshot(), 2*ttl
	served := r.served()
	time.Sleep(window) // the measurement window itself
	rates := r.rates(steady, r.snapshot(), window)
	servedRate := float64(total(r.served())-total(served)) / window.Seconds()
	var sum float64
	for _, m := range rates {
		for _, v := range m {
			sum += v
		}
	}
	perProc := sum / float64(len(rates))
	b.Logf("%s: steady state, one waiting process: %.1f req/s (%s)", cb.name, perProc, r.kinds(steady, r.snapshot(), float64(len(rates))*window.Seconds()))
	if r.srv.server != nil {
		b.Logf("%s: steady state, served for all %d processes: %.1f req/s (%s)", cb.name, procs, servedRate, r.kinds([]map[string]int64{served}, []map[string]int64{r.served()}, window.Seconds()))
	}
	if r.srv.watches != nil {
		if w, err := r.srv.watches(); err != nil {
			b.Logf("%s: watches: %v", cb.name, err)
		} else {
			b.Logf("%s: server holds, for %d candidates: %s", cb.name, procs*per, w)
		}
	}

	var handovers, failovers []time.Duration
	var woken, extra, servedExtra []float64
	herd := map[string]float64{}
	for b.Loop() {
		for range candHandOvers {
			before, servedBefore := r.snapshot(), r.served()
			start := time.Now()
			resigned, next := r.handOver(holder)
			handovers = append(handovers, next.at.Sub(resigned))
			time.Sleep(candSettle) // counting the hand-over's requests, not synchronisation
			after, servedAfter := r.snapshot(), r.served()
			el := time.Since(start)
			servedExtra = append(servedExtra, float64(total(servedAfter)-total(servedBefore))-servedRate*el.Seconds())
			w, x, kinds := r.excess(before, after, rates, el)
			woken, extra = append(woken, w), append(extra, x)
			for k, v := range kinds {
				herd[k] += v
			}
			holder = next
			r.noSecondHolder()
		}
		killed := time.Now()
		dead := r.workers[holder.proc]
		dead.kill()
		dead.dead = true
		next := r.nextWon(&holder)
		if next.proc == dead.idx {
			b.Fatalf("%s: %s won in the killed process %d", cb.name, next.id, dead.idx)
		}
		failovers = append(failovers, next.at.Sub(killed))
		holder = next
		w := r.startWorker()
		r.waitReady(w)
	}
	// Reported after the loop: b.Loop's start deletes metrics reported
	// before it.
	b.ReportMetric(perProc, "req/s/proc")
	b.ReportMetric(perProc/float64(per), "req/s/candidate")
	if r.srv.server != nil {
		b.ReportMetric(servedRate, "served-req/s")
		b.ReportMetric(servedRate/float64(procs*per), "served-req/s/candidate")
	}
	report(b, slices.Clone(failovers), "failover")
	b.ReportMetric(float64(bound(cb.name, ttl).Milliseconds()), "bound-ms")
	b.Logf("%s: hand-overs in order: %v", cb.name, handovers)
	sort.Slice(handovers, func(i, j int) bool { return handovers[i] < handovers[j] })
	b.ReportMetric(ms(handovers[len(handovers)/2]), "handover-p50-ms")
	b.ReportMetric(ms(handovers[(len(handovers)*99+99)/100-1]), "handover-p99-ms")
	b.ReportMetric(mean(woken), "procs-active/handover")
	b.ReportMetric(mean(extra), "req/handover")
	if r.srv.server != nil {
		b.ReportMetric(mean(servedExtra), "served-req/handover")
	}
	n := float64(len(woken))
	var top []string
	for _, k := range slices.SortedFunc(maps.Keys(herd), func(a, c string) int { return int(herd[c] - herd[a]) }) {
		if herd[k]/n >= 0.5 {
			top = append(top, fmt.Sprintf("%s %.1f", k, herd[k]/n))
		}
	}
	b.Logf("%s: per hand-over, beyond the steady state: %s", cb.name, strings.Join(top, ", "))
}

// logErrs logs the workers' ERR and LOST lines, counted by their error.
func (r *candRun) logErrs() {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	for e, c := range r.errs {
		r.b.Logf("%s: %d× %s", r.name, c, e)
	}
}

// bound is TTL + one renew interval, the longest a crash failover may
// take on backend name at TTL ttl.
func bound(name string, ttl time.Duration) time.Duration {
	div := map[string]time.Duration{"etcd": 2, "consul": 4, "zookeeper": 3}[name]
	if div == 0 {
		div = 3
	}
	return ttl + ttl/div
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// startWorker starts a worker process (or, for an in-process backend, its
// equivalent) with r.per candidates, counting its requests.
func (r *candRun) startWorker() *candWorker {
	b := r.b
	w := &candWorker{idx: len(r.workers), reqs: newReqCounter(), ready: make(chan struct{})}
	r.workers = append(r.workers, w)
	spec := candSpec{Backend: r.name, Lease: r.lease, Proc: w.idx, N: r.per, TTL: r.ttl, DSN: r.srv.dsn}
	var out io.Reader
	if r.srv.inProcess != nil {
		be, disconnect, err := r.srv.inProcess(spec, w.reqs)
		if err != nil {
			b.Fatal(err)
		}
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			runWorker(ctx, spec, func() (baton.Backend, error) { return be, nil }, inR, outW)
			_ = outW.Close()
		}()
		var once sync.Once
		w.kill = func() {
			once.Do(func() {
				disconnect()
				cancel()
				_ = inW.Close()
				<-done
			})
		}
		b.Cleanup(w.kill)
		w.stdin, out = inW, outR
	} else {
		if r.srv.addr != "" {
			proxy := testserver.StartProxy(b, r.srv.addr)
			proxy.TapClient(r.srv.tap(w.reqs))
			spec.Addr = proxy.Addr()
		}
		spec.Dir = r.srv.dir
		if r.srv.prepare != nil {
			if err := r.srv.prepare(&spec); err != nil {
				b.Fatal(err)
			}
		}
		js, _ := json.Marshal(spec)
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), envCandWorker+"="+string(js))
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		var once sync.Once
		w.kill = func() {
			once.Do(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
		}
		b.Cleanup(w.kill)
		w.stdin, out = stdin, stdout
	}
	go r.read(w, out)
	return w
}

// read turns w's lines into events.
func (r *candRun) read(w *candWorker, out io.Reader) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		f := strings.SplitN(line, " ", 3)
		e := candEvent{proc: w.idx, kind: f[0], line: line}
		switch e.kind {
		case "READY":
			close(w.ready)
			continue
		case "WON":
			if len(f) == 3 {
				e.id = f[1]
				rest := strings.Fields(f[2])
				ns, _ := strconv.ParseInt(rest[0], 10, 64)
				e.at = time.Unix(0, ns)
				if len(rest) > 1 {
					e.token, _ = strconv.ParseUint(rest[1], 10, 64)
				}
			}
		case "RESIGNED":
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			e.at = time.Unix(0, ns)
		case "ERR", "LOST":
			msg := ""
			if len(f) == 3 {
				msg = f[2]
			}
			r.errMu.Lock()
			r.errs[e.kind+" "+msg]++
			r.errMu.Unlock()
			continue
		}
		r.events <- e
	}
}

func (r *candRun) waitReady(w *candWorker) {
	select {
	case <-w.ready:
	case <-time.After(candHang):
		r.b.Fatalf("%s: worker %d did not start its %d candidates within %v", r.name, w.idx, r.per, candHang)
	}
}

// nextWon waits for the next WON event. A RESIGNED in between is an
// error: the caller consumes its own.
func (r *candRun) nextWon(prev *candEvent) candEvent {
	for {
		select {
		case e := <-r.events:
			switch e.kind {
			case "WON":
				if prev != nil && e.token <= prev.token {
					r.b.Fatalf("%s: %s won with token %d after %s's %d: tokens must increase", r.name, e.id, e.token, prev.id, prev.token)
				}
				return e
			default:
				r.b.Fatalf("%s: unexpected %q while waiting for a winner", r.name, e.line)
			}
		case <-time.After(candHang):
			r.b.Fatalf("%s: no candidate won within %v", r.name, candHang)
		}
	}
}

// handOver tells holder's worker to resign, and returns when it did and
// the next WON, which other workers may report before it tells.
func (r *candRun) handOver(holder candEvent) (resigned time.Time, next candEvent) {
	_, _ = io.WriteString(r.workers[holder.proc].stdin, "resign\n")
	for resigned.IsZero() || next.kind == "" {
		select {
		case e := <-r.events:
			switch {
			case e.kind == "RESIGNED" && resigned.IsZero():
				resigned = e.at
			case e.kind == "WON" && next.kind == "":
				if e.token <= holder.token {
					r.b.Fatalf("%s: %s won with token %d after %s's %d: tokens must increase", r.name, e.id, e.token, holder.id, holder.token)
				}
				next = e
			default:
				r.b.Fatalf("%s: unexpected %q in a hand-over from %s", r.name, e.line, holder.id)
			}
		case <-time.After(candHang):
			r.b.Fatalf("%s: hand-over from %s not done within %v", r.name, holder.id, candHang)
		}
	}
	return resigned, next
}

// noSecondHolder fails if a candidate won while another holds: exactly one
// WON per hand-over.
func (r *candRun) noSecondHolder() {
	select {
	case e := <-r.events:
		r.b.Fatalf("%s: %q while another candidate holds", r.name, e.line)
	default:
	}
}

// served returns the server's own counts (candServer.server), or nil.
func (r *candRun) served() map[string]int64 {
	if r.srv.server == nil {
		return nil
	}
	return r.srv.server()
}

// snapshot returns every live worker's request counts.
func (r *candRun) snapshot() []map[string]int64 {
	s := make([]map[string]int64, len(r.workers))
	for i, w := range r.workers {
		if !w.dead {
			s[i] = w.reqs.snapshot()
			if err := w.reqs.err(); err != nil {
				r.b.Fatalf("%s: worker %d's requests cannot be counted: %v", r.name, i, err)
			}
		}
	}
	return s
}

// rates returns each worker's requests per second between two
// snapshots, by type.
func (r *candRun) rates(before, after []map[string]int64, d time.Duration) map[int]map[string]float64 {
	rates := map[int]map[string]float64{}
	for i := range before {
		if before[i] != nil && i < len(after) && after[i] != nil {
			rates[i] = map[string]float64{}
			for k, v := range after[i] {
				if k != h2Ping {
					rates[i][k] = float64(v-before[i][k]) / d.Seconds()
				}
			}
		}
	}
	return rates
}

// kinds describes the requests between two snapshots, per 1/div second.
func (r *candRun) kinds(before, after []map[string]int64, div float64) string {
	sum := map[string]float64{}
	for i := range before {
		if before[i] == nil || after[i] == nil {
			continue
		}
		for k, v := range after[i] {
			if d := v - before[i][k]; d > 0 {
				sum[k] += float64(d)
			}
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(sum)) {
		parts = append(parts, fmt.Sprintf("%s %.2f/s", k, sum[k]/div))
	}
	return strings.Join(parts, ", ")
}

// excess compares the window between two snapshots, of length d, with
// the steady state. A worker took part in it if it sent a type of request
// it does not send in the steady state, or more than twice as many plus
// two of one it does (renewals come in bursts: one more than the mean is
// noise, not a wake-up). Returned: the workers that took part, the
// requests they sent beyond their steady rate, and those by type.
func (r *candRun) excess(before, after []map[string]int64, rates map[int]map[string]float64, d time.Duration) (active, extra float64, kinds map[string]float64) {
	kinds = map[string]float64{}
	for i := range before {
		if before[i] == nil || i >= len(after) || after[i] == nil {
			continue
		}
		took := false
		for k, v := range after[i] {
			if k == h2Ping {
				continue
			}
			n, want := float64(v-before[i][k]), rates[i][k]*d.Seconds()
			if n > 2*want+2 || (want == 0 && n > 0) {
				took = true
			}
		}
		if !took {
			continue
		}
		active++
		for k, v := range after[i] {
			if k == h2Ping {
				continue
			}
			x := float64(v-before[i][k]) - rates[i][k]*d.Seconds()
			extra += x
			kinds[k] += x
		}
	}
	return active, extra, kinds
}
