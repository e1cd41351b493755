package kubernetes

import (
	"testing"

	"github.com/batonhq/baton/internal/balancetest"
	"github.com/batonhq/baton/internal/benchci"
)

// TestBenchmarks runs every benchmark of the package once at its small size
// (benchci.Size: a 3 s lease with client-go's proportions, a 2 s window),
// as a test that it still works; see package internal/benchci. It checks
// what each reports for sanity, never for speed.
func TestBenchmarks(t *testing.T) { benchci.Run(t) }

var (
	_ = benchci.Register(BenchmarkKubernetesCrashFailover, "failover-median-ms>0")
	_ = benchci.Register(BenchmarkKubernetesGracefulHandOver, "failover-median-ms>0")
	_ = benchci.Register(BenchmarkKubernetesRequests, "baton-req/s/process>0", "client-go-req/s/process>0")
	// candidates_test.go (its small size: 2 processes × 10 candidates)
	// manyleases_test.go (its small size: 20 Leases)
	_ = benchci.Register(BenchmarkTenThousandLeases, "cpu-%>=0", "heap-MB", "goroutines>0", "update-per-s>0", "get-per-s>=0", "lost>=0", "server-cpu-%>=0")
	_ = benchci.Register(BenchmarkKubernetesTenThousandCandidates, "failover-median-ms>0", "handover-p50-ms>0", "req/s/proc>=0")
	// balance_test.go (its small size: 5 instances × 50 leases)
	_ = benchci.Register(BenchmarkKubernetesBalance, balancetest.BenchMetrics...)
)
