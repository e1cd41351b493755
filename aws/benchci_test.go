package aws

import (
	"testing"

	"github.com/batonhq/baton/internal/benchci"
)

// TestBenchmarks runs every benchmark of the package once, as a test that
// it still works; see package internal/benchci. BenchmarkSteadyStateCalls
// runs on a simulated clock, so its small size is its full size.
func TestBenchmarks(t *testing.T) { benchci.Run(t) }

var _ = benchci.Register(BenchmarkSteadyStateCalls, "calls/instance/min>0")
