// Package bench holds baton's benchmarks: crash failover and graceful
// hand-over time, steady-state backend requests per process, and the CPU and
// memory cost of holding 10,000 leases in one process, for each backend
// against its real server. Run them with
//
//	go test -run '^$' -bench . -benchtime 5x ./bench
//
// Figures are reported as custom metrics (failover-ms, req/s, cpu-%, heap-MB),
// never asserted: speed lives in benchmarks, not in tests.
package bench
