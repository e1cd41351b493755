package bench

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/chaos/fenced"
	"github.com/batonhq/baton/internal/balancetest"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testserver"
)

// balanceTargets are the backends BenchmarkBalanceHundredInstances can run
// on (Kubernetes: BenchmarkKubernetesBalance in bench/kubernetes):
// memory and etcd by default, the size CI runs within benchci's bound on a
// child run; BATON_BENCH_BALANCE_BACKENDS (a comma-separated list of their
// names) picks others. memory-saturated is no store of its own: the memory
// store behind a fixed rate of requests (saturatedMemoryTarget), where the
// shape a saturated store gives a large group shows in minutes.
var balanceTargets = map[string]func(*testing.B) target{
	"memory": memoryTarget, "etcd": etcdTarget, "zookeeper": zookeeperTarget, "consul": balanceConsulTarget,
	"postgres": balancePostgresTarget, "redis": redisTarget, "dynamodb": dynamoTarget, "raft": raftTarget,
	"memory-saturated": saturatedMemoryTarget,
}

// balanceTargetNames lists balanceTargets' names, for an error message.
func balanceTargetNames() string {
	names := make([]string, 0, len(balanceTargets))
	for name := range balanceTargets {
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// balanceConsulTarget is consulTarget on an agent that takes every
// instance's connections: the benchmark's instances all connect from
// 127.0.0.1, where in production each has its own host's agent, and each
// holds a blocking query per group of keys it watches, beyond the
// agent's default limit of 200 connections per client address.
func balanceConsulTarget(b *testing.B) target {
	return consulTargetOn(testserver.StartConsul(b, testserver.ConsulOptions{HTTPMaxConnsPerClient: 15000}))
}

// balancePostgresTarget is postgresTarget with one pooled connection per
// instance beside its LISTEN connection, so that 100 instances stay within
// the test server's max_connections (300); an instance's lease writes are
// one batched statement per renew interval, which one connection carries.
func balancePostgresTarget(b *testing.B) target {
	return postgresTargetWith(b, 1)
}

// BenchmarkBalanceHundredInstances: 10,000 leases spread by package balance
// over 100 instances, each a balance.Group on a backend client of its own
// (its own session), in this one process; once the spread is even, the
// first instance leaves gracefully, then a new one joins: what
// balancetest.Bench measures and reports, and its environment variables.
// Every lease's work writes to the chaos harness's fenced store when it
// starts and when it stops; the benchmark fails if any lease was held
// twice, and reports (late-writes) the overlaps of work that ran past its
// term's safe-until before its goroutine saw its context end (a paused
// holder, on a machine too busy to schedule it; the fence refused those
// writes). BATON_BENCH_BALANCE_SIZE sets the size (balancetest.BenchSize).
func BenchmarkBalanceHundredInstances(b *testing.B) {
	names := []string{"memory", "etcd"}
	if s := os.Getenv("BATON_BENCH_BALANCE_BACKENDS"); s != "" {
		names = strings.Split(s, ",")
	}
	for _, name := range names {
		mk := balanceTargets[name]
		if mk == nil {
			b.Fatalf("BATON_BENCH_BALANCE_BACKENDS: no backend %q; the names are %s", name, balanceTargetNames())
		}
		tg := mk(b)
		b.Run(tg.name, func(b *testing.B) {
			for b.Loop() {
				balanceLeaveJoin(b, tg)
			}
		})
	}
}

func balanceLeaveJoin(b *testing.B, tg target) {
	n, leases := balancetest.BenchSize(b, benchci.Small())
	balancetest.Bench{
		Instances: n, Leases: leases,
		New: func(b *testing.B, cfg backend.Config) (baton.Backend, func()) {
			p := tg.new(b, cfg)
			return p.backend, p.kill
		},
		Fence: fenced.New(),
	}.Run(b, tg.name)
}

var _ = benchci.Register(BenchmarkBalanceHundredInstances, balancetest.BenchMetrics...)
