package aws

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkSteadyStateCalls reports the AWS calls per instance per minute
// that following a raft group's membership costs in steady state, for
// groups of 3, 30 and 100 instances: the raft leader's Departed every 5 s,
// answered from the cache (default CacheTTL), against the fake AWS on a
// simulated clock. Each iteration simulates ten minutes.
func BenchmarkSteadyStateCalls(b *testing.B) {
	const simulated = 10 * time.Minute
	for _, n := range []int{3, 30, 100} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			total := 0
			for b.Loop() {
				for _, c := range steadyState(b, n, simulated) {
					total += c
				}
			}
			b.ReportMetric(float64(total)/float64(b.N)/float64(n)/simulated.Minutes(), "calls/instance/min")
		})
	}
}
