package bench

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// idleBackend is one backend of BenchmarkIdleRunEachBackend: the
// `baton run` flags of process i (0: the holder) and what it adds to their
// environment.
type idleBackend struct {
	name string
	args func(i int) []string
	env  []string
}

// BenchmarkIdleRunEachBackend: the idle cost of `baton run` on the backends
// BenchmarkIdleRunVsPeers leaves out (it runs etcd and Consul beside their
// peers' CLIs): ZooKeeper, PostgreSQL, Redis, DynamoDB (the dynalite
// emulator), Kubernetes (kube-apiserver) and the embedded raft group, whose
// members are the three `baton run` processes themselves. One holder and two
// standbys each, at baton's default TTL, all trios in one window; CPU per
// process as in BenchmarkIdleRunVsPeers (`baton run` and its guards, not
// the command it runs). Each process reaches its server directly (no
// counting proxy). The benchmark fails if a process exits or the leader
// changes during the run, so an idle figure is one of a trio that stayed
// idle. -benchtime Nx measures N windows of a minute:
//
//	go test -run '^$' -bench IdleRunEachBackend -benchtime 1x -timeout 30m -v ./bench
func BenchmarkIdleRunEachBackend(b *testing.B) {
	bin, child := buildBaton(b), writeChild(b)
	backends := []idleBackend{
		{name: "zookeeper", args: same("--backend", "zk://"+testserver.StartZooKeeper(b, testserver.ZooKeeperOptions{}).Addr()+"/idle")},
		{name: "postgres", args: same("--backend", testserver.StartPostgres(b).NewDatabase(b))},
		{name: "redis", args: same("--backend", "redis://"+testserver.StartRedis(b, testserver.RedisOptions{}).Addr()+"/0")},
		{name: "dynamodb", args: same("--backend", "dynamodb://baton-bench?region=us-east-1&endpoint="+url.QueryEscape(dynamoTable(b).Endpoint)),
			env: []string{"AWS_ACCESS_KEY_ID=AKIDBATONBENCH", "AWS_SECRET_ACCESS_KEY=secret", "AWS_EC2_METADATA_DISABLED=true",
				"AWS_CONFIG_FILE=" + filepath.Join(b.TempDir(), "none"), "AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(b.TempDir(), "none")}},
		{name: "kubernetes", args: same("--backend", idleKubeURL(b))},
		idleRaft(b),
	}
	base := fmt.Sprintf("idle-%d", time.Now().UnixNano())
	trios := make([]*trio, len(backends))
	comms := []string{"baton", guardComm}
	for i, be := range backends {
		t := &trio{spec: trioSpec{tool: "baton"}, lease: fmt.Sprintf("%s-%d", base, i)}
		trios[i] = t
		for j, role := range roles {
			t.procs = append(t.procs, startIdleProc(b, bin, child, be, t, j, role))
		}
	}
	for i, t := range trios {
		waitFor(b, 2*time.Minute, backends[i].name+": the holder leads", func() (bool, error) {
			for _, p := range t.procs {
				select {
				case <-p.exited:
					b.Fatalf("%s, %s exited:\n%s", backends[i].name, p.role, p.out)
				default:
				}
			}
			n := 0
			for _, p := range t.procs {
				n += int(p.led.Load())
			}
			return n > 0, nil
		})
	}
	window, warmUp := idleWindow()
	time.Sleep(warmUp) // left out of the measurement, not synchronisation

	snap := func() [][]map[int]procCPU {
		out := make([][]map[int]procCPU, len(trios))
		for i, t := range trios {
			for _, p := range t.procs {
				cpu, err := toolCPU(p.cmd.Process.Pid, comms)
				if err != nil {
					b.Fatalf("%s, %s: %v", backends[i].name, p.role, err)
				}
				out[i] = append(out[i], cpu)
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

	var summary strings.Builder
	fmt.Fprintf(&summary, "\n| backend | holder | standby-1 | standby-2 | per process (%% of a core) | leader changes |\n|---|---:|---:|---:|---:|---:|\n")
	for i, t := range trios {
		var sum time.Duration
		pcts := make([]string, len(t.procs))
		for j, p := range t.procs {
			var cpu time.Duration
			for _, pid := range slices.Sorted(maps.Keys(after[i][j])) {
				cpu += after[i][j][pid].cpu - before[i][j][pid].cpu
			}
			sum += cpu
			pcts[j] = fmt.Sprintf("%.3f", 100*cpu.Seconds()/secs)
			select {
			case <-p.exited:
				b.Errorf("%s, %s exited during the run:\n%s", backends[i].name, p.role, p.out)
			default:
			}
		}
		changes, err := t.tl.check()
		if err != nil {
			b.Errorf("%s: %v", backends[i].name, err)
		}
		if changes != 0 {
			b.Errorf("%s: the leader changed %d times while nothing happened", backends[i].name, changes)
		}
		perProc := 100 * sum.Seconds() / secs / float64(len(t.procs))
		fmt.Fprintf(&summary, "| %s | %s | %.3f | %d |\n", backends[i].name, strings.Join(pcts, " | "), perProc, changes)
		b.ReportMetric(perProc, backends[i].name+"-cpu-%/proc")
	}
	b.Logf("`baton run` CPU per process over %.0f s, in %% of one core, 1 holder + 2 standbys per backend, default TTL:%s", secs, summary.String())
	if b.Failed() {
		for i, t := range trios {
			for _, p := range t.procs {
				b.Logf("%s, %s output:\n%s", backends[i].name, p.role, p.out)
			}
		}
	}
}

// same returns args for every process.
func same(args ...string) func(int) []string { return func(int) []string { return args } }

// startIdleProc starts process i of be's trio t, in role.
func startIdleProc(b *testing.B, bin, child string, be idleBackend, t *trio, i int, role string) *peerProc {
	b.Helper()
	p := &peerProc{role: role, id: role, counter: newReqCounter(), out: new(testserver.SyncBuffer), tl: &t.tl, exited: make(chan struct{})}
	args := append([]string{"run"}, be.args(i)...)
	args = append(args, "--lease", t.lease, "--id", p.id, "--log-level", "warn", "--", "sh", child, p.id)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(cleanEnv(), be.env...)
	p.cmd.Stderr = p.out
	p.cmd.Stdout = &leaderLines{p: p}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.WaitDelay = time.Second
	if err := p.cmd.Start(); err != nil {
		b.Fatalf("start %s on %s: %v", role, be.name, err)
	}
	go func() {
		defer close(p.exited)
		_ = p.cmd.Wait()
	}()
	b.Cleanup(func() { p.stop(b) })
	return p
}

// idleKubeURL starts a kube-apiserver and returns the k8s:// URL of its
// default namespace, as its administrator.
func idleKubeURL(b *testing.B) string {
	srv := testserver.StartKubeAPIServer(b)
	kc := filepath.Join(b.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, srv.Kubeconfig(srv.Host(), testserver.KubeAdminUser, "default"), 0o600); err != nil {
		b.Fatal(err)
	}
	return "k8s://default?" + url.Values{"kubeconfig": {kc}}.Encode()
}

// idleRaft is the embedded raft group of three `baton run` processes, each
// a voter, joined by a shared secret (no certificates).
func idleRaft(b *testing.B) idleBackend {
	addrs := []string{testkit.FreeAddr(b, "127.0.0.1"), testkit.FreeAddr(b, "127.0.0.1"), testkit.FreeAddr(b, "127.0.0.1")}
	return idleBackend{
		name: "raft",
		args: func(i int) []string {
			return []string{"--backend", "raft://", "--bind", addrs[i], "--join", "static:" + strings.Join(addrs, ","), "--bootstrap-expect", "3"}
		},
		env: []string{"BATON_SECRET=idle-benchmark-secret-0123456789abcdef"},
	}
}

var _ = benchci.Register(BenchmarkIdleRunEachBackend, "zookeeper-cpu-%/proc>=0", "postgres-cpu-%/proc>=0", "redis-cpu-%/proc>=0",
	"dynamodb-cpu-%/proc>=0", "kubernetes-cpu-%/proc>=0", "raft-cpu-%/proc>=0")
