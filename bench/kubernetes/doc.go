// Package kubernetes holds the Kubernetes benchmarks: crash failover,
// graceful hand-over and requests per process per second of baton's
// Kubernetes backend and of client-go's leaderelection.LeaderElector, side
// by side, at the same lease duration (client-go's defaults: 15 s lease,
// 10 s renew deadline, 2 s retry period), against one real kube-apiserver
// (v1.37.2, built from the tools module, on its own etcd). Run them with
//
//	go test -run '^$' -bench . -benchtime 1x -timeout 30m -v ./bench/kubernetes
//
// They are a module of their own, as backend/kubernetes is, because they
// import client-go, which neither the root module nor package bench's
// module requires.
//
// Figures are reported as custom metrics, never asserted. TestBenchmarks
// runs each benchmark once at a small size (a 3 s lease with client-go's
// proportions, a 2 s window), as a test that it still works; see package
// bench's "Benchmarks in CI".
package kubernetes
