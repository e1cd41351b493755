// Package bench holds baton's benchmarks: crash failover and graceful
// hand-over time, steady-state backend requests per process, and the CPU and
// memory cost of holding 10,000 leases in one process, for each backend
// against its real server. Run them with
//
//	go test -run '^$' -bench . -benchtime 5x ./bench
//
// The BenchmarkRequestsVs benchmarks put baton beside each peer's own tool
// on one server (`baton run` and `etcdctl lock`, Curator's LeaderLatch,
// `consul lock`; one holder and two standbys each) and print every
// process's requests per second by request type, as the server receives
// them. Each measures one 60 s window per iteration:
//
//	go test -run '^$' -bench RequestsVs -benchtime 1x -timeout 30m -v ./bench
//
// BenchmarkIdleRunVsPeers measures, the same way, the CPU per process of an
// idle `baton run` (with its guards) beside `etcdctl lock` and `consul
// lock`, over windows of a minute; with -short, one window of a few seconds
// checks that it still works:
//
//	go test -run '^$' -bench IdleRunVsPeers -benchtime 3x -timeout 30m -v ./bench
//
// The figures behind the conformance suite's order checks (batontest asserts
// what happens and in which order, with hang bounds only) are here too: a cut
// off holder's stop and its successor's gap (BenchmarkCutOffHolderStops), a
// campaign after a cancelled waiter (BenchmarkCampaignAfterCancelledWaiter)
// and terms per second among many Electors (BenchmarkElectorTerms). The raft
// crash failover of a holder on a raft follower and on the raft leader is
// BenchmarkCrashFailoverRaftMember. The graceful hand-over of `baton run`
// itself (SIGTERM to the holder until the next holder's command has
// started; three processes on etcd at TTL 2 s), beside the library's
// resign on the same server, is BenchmarkRunHandOver:
//
//	go test -run '^$' -bench RunHandOver -benchtime 20x -v ./bench
//
// BenchmarkTenThousandCandidates puts many candidates on one lease, in
// worker processes (this test binary run again), and measures hand-over,
// crash failover and what each hand-over and each waiting process costs
// the server, request by request (its Kubernetes twin is in
// ./bench/kubernetes):
//
//	go test -run '^$' -bench TenThousandCandidates -benchtime 2x -timeout 60m -v ./bench
//
// Figures are reported as custom metrics (failover-ms, req/s, cpu-%, heap-MB,
// stop-ms, gap-ms, campaign-ms, term-ms, and the -p50-ms and -p99-ms of
// BenchmarkRunHandOver), never asserted: speed lives in benchmarks, not in
// tests.
//
// # Benchmarks in CI
//
// Every benchmark also runs in the tests, at a small size, so that the
// README's test command (`go test -race -timeout 30m work`) shows at once when one no
// longer works: TestBenchmarks runs each registered benchmark once
// (-benchtime 1x) in a child process of the test binary with
// BATON_BENCH_SMALL=1, and checks that it did not fail or skip and that it
// reported its metrics, finite and within sanity bounds (a hand-over
// happened, a count is above zero), never how fast (package
// internal/benchci). A benchmark takes the sizes that make it slow from
// benchci.Size, which returns the full size under -bench and the small one
// there (a 1 s window for 10 s, 10 leases for 10,000); its measurement
// logic is the same at both. A new benchmark is registered next to its
// func, in one line:
//
//	var _ = benchci.Register(BenchmarkX, "failover-median-ms>0", "req/s/process>=0")
//
// TestBenchmarks/registered fails for a benchmark that is not. The small
// run by hand, with its figures:
//
//	BATON_BENCH_SMALL=1 go test -run '^$' -bench . -benchtime 1x -v ./bench
package bench
