package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The idle cost of one `baton run`: the CPU that `baton run` spends while
// nothing happens (it holds the lease, or stands by, and renews), beside
// `etcdctl lock` and `consul lock` doing the same on the same server, one
// holder and two standbys each, at each tool's defaults. Counted per
// process of a trio: the CPU time (utime + stime in /proc/PID/stat, what
// top and ps show) of the tool's own processes, that is the process the
// user started and those of its descendants that are the tool itself: for
// baton its guards ("baton-guard": the holder's command's, and the one
// started ahead for the next term), for the CLIs nothing more. The command
// run while leading (a shell script that sleeps) is the user's, the same
// for every tool, and left out. Every process reaches its server through
// a proxy of its own that counts its requests, as in the RequestsVs
// benchmarks, so the table shows that the tools send alike.

// idleWindow is one measurement window, and the warm-up left out before
// it: a minute (CPU time counts in ticks of 10 ms, so that a process at
// 0.03 % of a core shows 2 of them), or, with -short or at benchci's small
// size, a few seconds,
// which checks that the benchmark still works (CI) without measuring
// anything worth reading.
func idleWindow() (window, warmUp time.Duration) {
	if testing.Short() || benchci.Small() {
		return 3 * time.Second, time.Second
	}
	return time.Minute, peerWarmUp
}

// idleTrio is one tool's trio on one server, and the names (comm) of the
// tool's own processes.
type idleTrio struct {
	server string
	spec   trioSpec
	comms  []string
	pb     *peerBackend
	t      *trio
}

// BenchmarkIdleRunVsPeers: CPU per process, in % of one core, of `baton
// run` beside `etcdctl lock` (Debian's etcd-client) on one embedded etcd,
// and beside `consul lock` on one Consul agent, one holder and two standbys
// each, at each tool's defaults (etcd: a 10 s TTL for both; Consul: baton's
// 20 s TTL asks a session TTL of 10 s, `consul lock` asks 15 s), all four
// trios in one window. -benchtime Nx measures N windows of a minute.
func BenchmarkIdleRunVsPeers(b *testing.B) {
	etcdctl, err := exec.LookPath("etcdctl")
	if err != nil {
		testserver.Unavailable(b, "etcdctl", fmt.Errorf("%w (Debian: apt-get install etcd-client)", err))
	}
	etcd := testserver.StartEtcd(b)
	consul := testserver.StartConsul(b, testserver.ConsulOptions{})
	bin, child := buildBaton(b), writeChild(b)

	ecli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer ecli.Close()
	ccli, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		b.Fatal(err)
	}

	etcdPB := &peerBackend{
		target: strings.TrimPrefix(etcd.Endpoint(), "http://"),
		tap:    grpcTap,
		contenders: func(_ trioSpec, lease string) (int, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := ecli.Get(ctx, lease+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return int(resp.Count), nil
		},
	}
	const prefix, lockSession = "idle", "idle-consul-lock"
	consulPB := &peerBackend{
		target: consul.Addr(),
		tap:    httpTap,
		// Every contender has a session of its own: baton's are named
		// "baton", the CLI's are named here.
		contenders: func(spec trioSpec, _ string) (int, error) {
			name := "baton"
			if spec.tool != "baton" {
				name = lockSession
			}
			ss, _, err := ccli.Session().List(&api.QueryOptions{})
			n := 0
			for _, s := range ss {
				if s.Name == name {
					n++
				}
			}
			return n, err
		},
	}
	etcdLock := func(b *testing.B, addr, lease, id string) *exec.Cmd {
		cmd := exec.Command(etcdctl, "--endpoints="+addr, "lock", "--", lease, "sh", child, id)
		cmd.Env = cleanEnv("ETCDCTL_API=3")
		return cmd
	}
	consulLock := func(b *testing.B, addr, lease, id string) *exec.Cmd {
		cmd := exec.Command(consul.Binary(), "lock", "-http-addr="+addr, "-name="+lockSession, prefix+"/"+lease, "sh "+child+" "+id)
		cmd.Env = cleanEnv()
		return cmd
	}
	batonComms := []string{"baton", guardComm}
	trios := []*idleTrio{
		{server: "etcd", pb: etcdPB, comms: batonComms,
			spec: batonTrio(bin, child, "", "10s (default)", func(addr string) string { return "etcd://" + addr })},
		{server: "etcd", pb: etcdPB, comms: []string{"etcdctl"},
			spec: trioSpec{tool: "etcdctl lock", ttl: "10s (default)", start: etcdLock}},
		{server: "consul", pb: consulPB, comms: batonComms,
			spec: batonTrio(bin, child, "", "20s (default; session TTL 10s)", func(addr string) string { return "consul://" + addr + "/" + prefix })},
		{server: "consul", pb: consulPB, comms: []string{"consul"},
			spec: trioSpec{tool: "consul lock", ttl: "session TTL 15s (default, fixed)", start: consulLock}},
	}
	base := fmt.Sprintf("idle-%d", time.Now().UnixNano())
	for i, it := range trios {
		it.t = &trio{spec: it.spec, lease: fmt.Sprintf("%s-%d", base, i)}
		holder := startProc(b, it.pb, it.t, roles[0])
		it.t.procs = append(it.t.procs, holder)
		waitFor(b, 60*time.Second, it.spec.tool+" on "+it.server+": the holder leads", func() (bool, error) {
			select {
			case <-holder.exited:
				b.Fatalf("%s holder exited:\n%s", it.spec.tool, holder.out)
			default:
			}
			return holder.led.Load() > 0, nil
		})
		for _, role := range roles[1:] {
			it.t.procs = append(it.t.procs, startProc(b, it.pb, it.t, role))
		}
	}
	for _, it := range trios {
		waitFor(b, 60*time.Second, it.spec.tool+" on "+it.server+": three contenders", func() (bool, error) {
			n, err := it.pb.contenders(it.spec, it.t.lease)
			return n == len(roles), err
		})
	}
	window, warmUp := idleWindow()
	time.Sleep(warmUp) // left out of the measurement, not synchronisation

	type sample struct {
		cpu  map[int]procCPU // the tool's processes of one process of a trio
		reqs map[string]int64
	}
	snap := func() [][]sample {
		out := make([][]sample, len(trios))
		for i, it := range trios {
			for _, p := range it.t.procs {
				cpu, err := toolCPU(p.cmd.Process.Pid, it.comms)
				if err != nil {
					b.Fatalf("%s on %s, %s: %v", it.spec.tool, it.server, p.role, err)
				}
				out[i] = append(out[i], sample{cpu: cpu, reqs: p.counter.snapshot()})
			}
		}
		return out
	}
	before := snap()
	start := time.Now()
	for b.Loop() {
		time.Sleep(window) // the measurement window itself
	}
	after := snap()
	secs := time.Since(start).Seconds()

	var summary, detail strings.Builder
	fmt.Fprintf(&summary, "\n| server | tool | TTL | holder | standby-1 | standby-2 | per process (%% of a core) | requests/s per process | leader changes |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&detail, "\n| server | tool | process | processes counted | CPU (ms) | %% of a core |\n|---|---|---|---|---:|---:|\n")
	for i, it := range trios {
		var cpuSum time.Duration
		var reqSum int64
		pcts := make([]string, len(it.t.procs))
		for j, p := range it.t.procs {
			b0, b1 := before[i][j], after[i][j]
			var cpu time.Duration
			var counted []string
			for _, pid := range slices.Sorted(maps.Keys(b1.cpu)) {
				// A process started within the window counts from its
				// start; one that ended within it is not counted (none
				// should, while nothing happens: the list shows it).
				cpu += b1.cpu[pid].cpu - b0.cpu[pid].cpu
				counted = append(counted, fmt.Sprintf("%s %d", b1.cpu[pid].comm, pid))
			}
			for pid, pc := range b0.cpu {
				if _, ok := b1.cpu[pid]; !ok {
					b.Logf("%s on %s, %s: %s %d ended during the window; its CPU is not counted", it.spec.tool, it.server, p.role, pc.comm, pid)
				}
			}
			cpuSum += cpu
			pct := 100 * cpu.Seconds() / secs
			pcts[j] = fmt.Sprintf("%.3f", pct)
			fmt.Fprintf(&detail, "| %s | %s | %s | %s | %d | %.3f |\n", it.server, it.spec.tool, p.role, strings.Join(counted, ", "), cpu.Milliseconds(), pct)
			delta := map[string]int64{}
			for k, v := range b1.reqs {
				delta[k] = v - b0.reqs[k]
			}
			n := total(delta)
			// A short window (-short) may hold no renewal.
			if n == 0 && secs >= 30 {
				b.Errorf("%s on %s, %s made no request in %.0f s", it.spec.tool, it.server, p.role, secs)
			}
			if err := p.counter.err(); err != nil {
				b.Errorf("%s on %s, %s: its requests could not be counted: %v", it.spec.tool, it.server, p.role, err)
			}
			reqSum += n
			select {
			case <-p.exited:
				b.Errorf("%s on %s, %s exited during the run:\n%s", it.spec.tool, it.server, p.role, p.out)
			default:
			}
		}
		if n, err := it.pb.contenders(it.spec, it.t.lease); err != nil || n != len(roles) {
			b.Errorf("%s on %s: %d contenders at the end (%v); want %d", it.spec.tool, it.server, n, err, len(roles))
		}
		changes, err := it.t.tl.check()
		if err != nil {
			b.Errorf("%s on %s: %v", it.spec.tool, it.server, err)
		}
		perProc := 100 * cpuSum.Seconds() / secs / float64(len(it.t.procs))
		fmt.Fprintf(&summary, "| %s | %s | %s | %s | %.3f | %.2f | %d |\n", it.server, it.spec.tool, it.spec.ttl,
			strings.Join(pcts, " | "), perProc, float64(reqSum)/secs/float64(len(it.t.procs)), changes)
		b.ReportMetric(perProc, strings.ReplaceAll(it.spec.tool, " ", "-")+"@"+it.server+"-cpu-%/proc")
	}
	b.Logf("CPU per process over %.0f s, in %% of one core, 1 holder + 2 standbys per tool, side by side:%s%s", secs, summary.String(), detail.String())
	if b.Failed() {
		for _, it := range trios {
			for _, p := range it.t.procs {
				b.Logf("%s on %s, %s output:\n%s", it.spec.tool, it.server, p.role, p.out)
			}
		}
	}
	// All at once, not one after the other as the clean-ups would: a
	// process that ignores SIGTERM costs its 10 s once, not each time.
	var wg sync.WaitGroup
	for _, it := range trios {
		for _, p := range it.t.procs {
			wg.Go(func() { p.stop(b) })
		}
	}
	wg.Wait()
}

// guardComm is the name (comm) of baton's guard processes.
const guardComm = "baton-guard"

// procCPU is one process's name and CPU time so far.
type procCPU struct {
	comm string
	cpu  time.Duration // utime + stime
}

// toolCPU returns the CPU time of root and of those of its descendants
// whose name is one of comms, reached only through such processes: below a
// process of another name (the command a tool runs) nothing is counted.
func toolCPU(root int, comms []string) (map[int]procCPU, error) {
	type proc struct {
		ppid int
		procCPU
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	all := map[int]proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		s := string(raw)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+2:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		// USER_HZ is 100 on Linux: ticks of 10 ms.
		all[pid] = proc{ppid: ppid, procCPU: procCPU{comm: s[open+1 : end], cpu: time.Duration(utime+stime) * 10 * time.Millisecond}}
	}
	r, ok := all[root]
	if !ok {
		return nil, fmt.Errorf("process %d is gone", root)
	}
	out := map[int]procCPU{root: r.procCPU}
	for grew := true; grew; {
		grew = false
		for pid, p := range all {
			if _, in := out[pid]; in {
				continue
			}
			if _, parentIn := out[p.ppid]; parentIn && slices.Contains(comms, p.comm) {
				out[pid] = p.procCPU
				grew = true
			}
		}
	}
	return out, nil
}

var _ = benchci.Register(BenchmarkIdleRunVsPeers, "baton@etcd-cpu-%/proc>=0", "etcdctl-lock@etcd-cpu-%/proc>=0",
	"baton@consul-cpu-%/proc>=0", "consul-lock@consul-cpu-%/proc>=0")
