package bench

import (
	"testing"

	"github.com/batonhq/baton/internal/benchci"
)

// TestBenchmarks runs every benchmark of the package once at its small size
// (benchci.Size), as a test that it still works; see package
// internal/benchci. It checks what each reports for sanity, never for
// speed. A new benchmark registers itself next to its func, as
//
//	var _ = benchci.Register(BenchmarkX, "unit>0")
//
// and TestBenchmarks/registered fails for one that does not.
func TestBenchmarks(t *testing.T) { benchci.Run(t) }

// The benchmarks that were here before benchci, registered in one place.
var (
	// bench_test.go
	_ = benchci.Register(BenchmarkCrashFailover, "failover-median-ms>0", "failover-max-ms>0")
	_ = benchci.Register(BenchmarkGracefulHandOver, "failover-median-ms>=0", "failover-max-ms>=0")
	_ = benchci.Register(BenchmarkSteadyState, "req/s/process>0")
	_ = benchci.Register(BenchmarkTenThousandLeases, "cpu-%>=0", "settled-cpu-%>=0", "heap-MB", "goroutines>0")
	// conformance_test.go
	_ = benchci.Register(BenchmarkCutOffHolderStops, "stop-median-ms>0", "gap-median-ms>=0")
	_ = benchci.Register(BenchmarkCampaignAfterCancelledWaiter, "campaign-median-ms>0")
	_ = benchci.Register(BenchmarkElectorTerms, "term-median-ms>0")
	// raft_test.go
	_ = benchci.Register(BenchmarkCrashFailoverRaftMember, "failover-median-ms>0", "raft-election-median-ms>0",
		"others-lost-frac>=0", "others-lost-frac<=1")
	_ = benchci.Register(BenchmarkSteadyStateRaftTraffic, "append-rpc/s/follower>0", "heartbeat-rpc/s/follower>=0", "log-entries/s>=0")
	// raftload_test.go: alone, since it hogs the CPU on purpose; the
	// longest renewal gap is 0 when every term ended (no renewal at all),
	// as a fault on a busy machine can do.
	_ = benchci.RegisterAlone(BenchmarkRaftUnderLoad, "lost/fault>=0", "elections/fault>=0", "renew-gap-max-ms>=0", "stall-median-ms>=0")
	// peers_test.go: at TTL 2 s, renewals fall in the short window;
	// Consul's sessions (10 s, 15 s) may renew in it or not.
	_ = benchci.Register(BenchmarkRequestsVsEtcdctl, "baton@2s-req/s/proc>0", "etcdctl-lock@2s-req/s/proc>0")
	_ = benchci.Register(BenchmarkRequestsVsCurator, "baton@2s-req/s/proc>0", "Curator-LeaderLatch@2s-req/s/proc>0")
	_ = benchci.Register(BenchmarkRequestsVsConsulLock, "baton@20s-req/s/proc>=0", "baton@30s-req/s/proc>=0", "consul-lock@15s-req/s/proc>=0")
	// postgres_test.go, postgres_load_test.go
	_ = benchci.Register(BenchmarkPostgresVsAdvisoryLock, "crash-median-ms>0", "cut-median-ms>0", "graceful-median-ms>0", "timeouts>=0")
	_ = benchci.Register(BenchmarkPostgresLoadVsAdvisoryLock, "holder-stmt/s>=0", "standby-stmt/s>=0", "stmt/s/process>=0",
		"holder-cpu-%>=0", "server-cpu-%>=0", "standby-cpu-%", "holder-stmt/s-with-standby>=0", "server-cpu-with-standby-%>=0")
	// redis_test.go
	_ = benchci.Register(BenchmarkRedisVsRedsync, "failover-median-ms>0", "req/s/process>0")
	// dynamodb_test.go
	_ = benchci.Register(BenchmarkDynamoDBCost, "holder-WRU/h>0", "holder-RRU/h>=0", "waiter-WRU/h>=0", "waiter-RRU/h>0",
		"holder-µ$/h>0", "waiter-µ$/h>0", "standby10-RRU/h>0", "standby10-req/h>0")
	// candidates_test.go (its small size: 2 processes × 10 candidates)
	_ = benchci.Register(BenchmarkTenThousandCandidates, "failover-median-ms>0", "handover-p50-ms>0", "req/s/proc>=0",
		"procs-active/handover>=0")
	// runhandover_test.go
	_ = benchci.Register(BenchmarkRunHandOver, "run-sigterm-p50-ms>0", "run-sigterm-p99-ms>0", "library-resign-p50-ms>0")
)
