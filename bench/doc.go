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
// Figures are reported as custom metrics (failover-ms, req/s, cpu-%, heap-MB),
// never asserted: speed lives in benchmarks, not in tests.
package bench
