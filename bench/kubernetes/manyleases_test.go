package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testserver"
)

// BenchmarkTenThousandLeases: CPU, heap and requests of one process holding
// 10,000 leases (TTL 10 s, as ./bench's BenchmarkTenThousandLeases) through
// baton's Kubernetes backend, CPU over a 10 s window. Each Lease is an
// object of its own, so the floor is one write (an update) per Lease per
// renew interval, 3,000 a second here, and no reads while nothing changes:
// update-per-s and get-per-s show how close baton comes. The client's rate
// limit is off (QPS −1), as it must be for a process that renews that many
// Leases; the API server (and its etcd) run as other processes on the same
// machine. A term that ended during the window is counted (lost), not
// fatal: on a small machine the API server may not keep up with the floor.
//
// The client speaks protobuf (application/vnd.kubernetes.protobuf, as
// NewForConfig sets by default), or JSON with BATON_BENCH_KUBE_JSON=1.
// server-cpu-% is the CPU of the benchmark's kube-apiserver and etcd
// together (their own processes), and server-cpu-ms/update their CPU per
// update: what the floor costs the server.
//
// n=1000 is the same at a tenth of the Leases (300 updates a second), which
// an API server on a small shared machine can take, for the cost per Lease.
// At benchci's small size: 20 Leases, TTL 2 s, a 2 s window.
func BenchmarkTenThousandLeases(b *testing.B) {
	for _, n := range benchci.Size([]int{1000, 10000}, []int{20}) {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { manyLeases(b, n) })
	}
}

// manyLeases is BenchmarkTenThousandLeases with n Leases.
func manyLeases(b *testing.B, n int) {
	srv := apiServer(b)
	for b.Loop() {
		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		p := manyLeasesProc(b, srv)
		be, err := kubernetes.New(p.cs, kubernetes.Options{
			RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: benchci.Size(10*time.Second, 2*time.Second)}},
			Namespace:     namespace,
		})
		if err != nil {
			b.Fatal(err)
		}
		prefix := fmt.Sprintf("many-%d", time.Now().UnixNano())
		terms := make([]baton.Term, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for i := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				t, err := be.Campaign(ctx, fmt.Sprintf("%s-%05d", prefix, i), baton.Candidate{ID: "many"})
				if err != nil {
					b.Errorf("campaign %d: %v", i, err)
					return
				}
				terms[i] = t
			})
		}
		wg.Wait()
		if b.Failed() {
			return
		}
		window := benchci.Size(10*time.Second, 2*time.Second)
		before := p.count.snapshot()
		srv0 := serverCPU()
		cpu0, start := cpuTime(), time.Now()
		time.Sleep(window) // the measurement window itself, not synchronisation
		cpu := cpuTime() - cpu0
		wall := time.Since(start)
		srvCPU := serverCPU() - srv0
		after := p.count.snapshot()
		runtime.GC()
		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		lost := 0
		for _, t := range terms {
			if t.Err() != nil {
				lost++
			}
		}
		if lost > 0 {
			b.Logf("%d of %d terms ended during the window (first: %v)", lost, n, firstErr(terms))
		}
		b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
		b.ReportMetric(float64(int64(m1.HeapInuse)-int64(m0.HeapInuse))/(1<<20), "heap-MB")
		b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
		b.ReportMetric(float64(after["update"]-before["update"])/wall.Seconds(), "update-per-s")
		b.ReportMetric(float64(after["get"]-before["get"])/wall.Seconds(), "get-per-s")
		b.ReportMetric(float64(lost), "lost")
		b.ReportMetric(100*srvCPU.Seconds()/wall.Seconds(), "server-cpu-%")
		if u := after["update"] - before["update"]; u > 0 {
			b.ReportMetric(float64(srvCPU.Microseconds())/1000/float64(u), "server-cpu-ms/update")
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(u), "cpu-ms/update")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		_ = be.Close(ctx) // releases every Lease
		cancel()
	}
}

// manyLeasesProc is newProc with the client's rate limit off.
func manyLeasesProc(b *testing.B, srv *testserver.KubeAPIServer) *proc {
	b.Helper()
	p := &proc{proxy: testserver.StartProxy(b, srv.Addr()), count: &counter{n: map[string]int64{}}}
	cfg := &rest.Config{
		Host:            "https://" + p.proxy.Addr(),
		BearerToken:     srv.Token(testserver.KubeAdminUser),
		TLSClientConfig: rest.TLSClientConfig{CAData: srv.CAData()},
		QPS:             -1,
		WrapTransport:   func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, p.count} },
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	if os.Getenv("BATON_BENCH_KUBE_JSON") == "1" {
		cfg.ContentType = "application/json"
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	p.cs = cs
	return p
}

func firstErr(terms []baton.Term) error {
	for _, t := range terms {
		if t.Err() != nil {
			return t.Err()
		}
	}
	return nil
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the user+system CPU time of this process's children named
// kube-apiserver and etcd (the test servers), from /proc.
func serverCPU() time.Duration {
	self := os.Getpid()
	dirs, _ := os.ReadDir("/proc")
	var ticks int64
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15)
		st := string(raw)
		open, close := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if open < 0 || close < open {
			continue
		}
		comm := st[open+1 : close]
		f := strings.Fields(st[close+1:])
		if len(f) < 13 || (comm != "kube-apiserver" && comm != "etcd") {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid != self {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ, 100 on Linux
}
