package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// handOverTTL is the TTL of the hand-over benchmarks of `baton run`.
const handOverTTL = 2 * time.Second

// BenchmarkRunHandOver: the graceful hand-over of `baton run`, as an
// operator sees it, beside the library's own resign on the same server.
// Three `baton run --ttl 2s` processes contend on one etcd server (from
// internal/testserver); each iteration sends SIGTERM to the holder (baton
// stops its command, waits for its guard to report the command's tree
// gone, releases the lease and exits) and measures the time until the next
// holder's command has started and said so on its stdout, then starts a
// third process again. In the same iteration, one Elector-less holder in
// this process resigns to a waiter on the same server: the time from the
// resign call to the waiter's term. Reported as p50 and p99 (the maximum
// at 20 samples) of each:
//
//	go test -run '^$' -bench RunHandOver -benchtime 20x ./bench
func BenchmarkRunHandOver(b *testing.B) {
	srv := testserver.StartEtcd(b)
	bin := buildBaton(b)
	lease := fmt.Sprintf("run-handover-%d", time.Now().UnixNano())
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: testserver.ClientDialTimeout, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cli.Close() })

	var (
		mu     sync.Mutex
		leader = make(chan *runProc, 4)
		procs  []*runProc
	)
	start := func(i int) {
		p := &runProc{id: fmt.Sprintf("baton-%d", i), leader: leader, out: new(testserver.SyncBuffer)}
		p.cmd = exec.Command(bin, "run", "--backend", "etcd://"+srv.Endpoint(), "--lease", lease, "--id", p.id,
			"--ttl", handOverTTL.String(), "--log-level", "warn", "--",
			"sh", "-c", `echo "LEADER $BATON_HOLDER"; exec sleep 100000`)
		p.cmd.Env = cleanEnv()
		p.cmd.Stdout = p
		p.cmd.Stderr = p.out
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		p.cmd.WaitDelay = time.Second
		p.exited = make(chan struct{})
		if err := p.cmd.Start(); err != nil {
			b.Fatal(err)
		}
		go func() {
			defer close(p.exited)
			_ = p.cmd.Wait()
		}()
		b.Cleanup(func() {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
			if b.Failed() {
				b.Logf("output of %s:\n%s", p.id, p.out)
			}
		})
		mu.Lock()
		procs = append(procs, p)
		mu.Unlock()
	}
	// queued waits until n candidates hold a key of the election.
	queued := func(n int) {
		waitFor(b, 30*time.Second, fmt.Sprintf("%d candidates queued on %s", n, lease), func() (bool, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r, err := cli.Get(ctx, lease+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				return false, err
			}
			c := 0
			for _, kv := range r.Kvs {
				if !strings.Contains(string(kv.Key), "!") {
					c++
				}
			}
			return c == n, nil
		})
	}
	next := 0
	for range 3 {
		start(next)
		next++
		queued(next)
	}
	var holder *runProc
	select {
	case holder = <-leader:
	case <-time.After(30 * time.Second):
		b.Fatal("no baton run's command started")
	}

	// The library's own resign on the same server, for comparison.
	lib := func(id string) *etcd.Backend {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		be, err := etcd.New(c, etcd.Options{Config: backend.Config{TTL: handOverTTL}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = be.Close(ctx)
			_ = c.Close()
		})
		return be
	}
	libHolder, libWaiter := &process{backend: lib("holder")}, &process{backend: lib("waiter")}

	var runs, resigns []time.Duration
	for i := 0; b.Loop(); i++ {
		// baton run: SIGTERM to the holder, until the next command starts.
		t0 := time.Now()
		if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			b.Fatal(err)
		}
		var nh *runProc
		select {
		case nh = <-leader:
		case <-time.After(30 * time.Second):
			b.Fatalf("no command started within 30s of SIGTERM to %s", holder.id)
		}
		if nh == holder {
			b.Fatalf("%s led again", holder.id)
		}
		runs = append(runs, nh.at.Sub(t0))
		select {
		case <-holder.exited:
		case <-time.After(30 * time.Second):
			b.Fatalf("%s did not exit within 30s of SIGTERM", holder.id)
		}
		if code := holder.cmd.ProcessState.ExitCode(); code != 0 {
			b.Fatalf("%s exited %d after SIGTERM, want 0", holder.id, code)
		}
		holder = nh
		start(next)
		next++
		queued(3)

		// The library: resign, until the waiter's campaign returns.
		name := fmt.Sprintf("%s-lib-%d", lease, i)
		th := mustCampaign(b, libHolder, name, "holder")
		got := testkit.CampaignAsync(b, libWaiter.backend, name, "waiter")
		waitFor(b, 30*time.Second, "the library's waiter to queue", func() (bool, error) {
			r, err := cli.Get(context.Background(), name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && r.Count >= 2, err
		})
		t1 := time.Now()
		if err := th.Resign(context.Background()); err != nil {
			b.Fatal(err)
		}
		resigns = append(resigns, testkit.WaitTerm(b, got, testkit.CampaignTimeout).At.Sub(t1))
	}
	percentiles(b, runs, "run-sigterm")
	percentiles(b, resigns, "library-resign")
	b.Logf("baton run, SIGTERM to the next command's start: %v", runs)
	b.Logf("library resign to the waiter's term: %v", resigns)
}

// percentiles reports the p50 and p99 of samples, in milliseconds.
func percentiles(b *testing.B, samples []time.Duration, what string) {
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	// Nearest rank: the smallest sample with at least p of all at or
	// below it (the 99th of 100 for p99; the maximum below 100 samples).
	at := func(p float64) time.Duration { return s[max(0, int(math.Ceil(p*float64(len(s))))-1)] }
	b.ReportMetric(float64(at(0.50).Microseconds())/1000, what+"-p50-ms")
	b.ReportMetric(float64(at(0.99).Microseconds())/1000, what+"-p99-ms")
}

// runProc is one `baton run` of BenchmarkRunHandOver. Its stdout (its
// command's) is scanned for the command's "LEADER" line.
type runProc struct {
	id     string
	cmd    *exec.Cmd
	out    *testserver.SyncBuffer
	exited chan struct{}
	leader chan<- *runProc
	at     time.Time // when its command said it started

	line []byte
}

func (p *runProc) Write(b []byte) (int, error) {
	now := time.Now()
	p.line = append(p.line, b...)
	for {
		i := bytes.IndexByte(p.line, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := string(p.line[:i])
		p.line = p.line[i+1:]
		fmt.Fprintln(p.out, line)
		if line == "LEADER "+p.id {
			p.at = now
			p.leader <- p
		}
	}
}
