package kubernetes

import (
	"testing"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/chaos/fenced"
	"github.com/batonhq/baton/internal/balancetest"
	"github.com/batonhq/baton/internal/benchci"
)

// BenchmarkKubernetesBalance is ./bench's BenchmarkBalanceHundredInstances
// on Kubernetes Leases: 10,000 leases spread by package balance over 100
// instances, each a balance.Group on a client of its own (through its own
// proxy, with its rate limit off, as manyLeasesProc's: an instance renews a
// Lease per lease it leads), all on the one kube-apiserver; then one
// instance leaves and one joins (balancetest.Bench), every lease's work
// checked by the chaos harness's fenced store. BATON_BENCH_BALANCE_SIZE
// sets the size (balancetest.BenchSize); an instance's TTL is 10 s, so
// 10,000 leases need an update of 3,000 Leases a second from the API
// server, more than one on a 2-core machine takes (BenchmarkTenThousandLeases).
func BenchmarkKubernetesBalance(b *testing.B) {
	srv := apiServer(b)
	n, leases := balancetest.BenchSize(b, benchci.Small())
	for b.Loop() {
		balancetest.Bench{
			Instances: n, Leases: leases,
			New: func(b *testing.B, cfg backend.Config) (baton.Backend, func()) {
				p := manyLeasesProc(b, srv)
				return p.batonWith(b, cfg), p.crash
			},
			Fence: fenced.New(),
		}.Run(b, "kubernetes")
	}
}
