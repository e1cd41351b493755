// Package baton elects one leader among the instances of a service and runs
// leader-only work while, and only while, an instance leads.
//
// # What is guaranteed, and what is not
//
// A lease has a name; holding it for one continuous span is a term.
//
//   - Fencing tokens: every term's token is strictly greater than those of
//     the earlier terms of its lease, on every backend, also after the
//     store lost its data (docs/guarantees.md says how, and what it assumes).
//   - Safe-until: the holder stops acting at the start of its last confirmed
//     renewal plus the TTL minus a drift margin, on its monotonic clock,
//     even when the backend cannot be reached.
//   - Takeover: a contender takes over only after the server reports the
//     holder's session dead, or after it has itself seen the lease
//     unrenewed for a full TTL.
//
// So two live leaders never act at once, given clocks whose rates differ by
// less than the drift margin. A process paused between checking its
// leadership and writing (GC, SIGSTOP, a VM migration) can still write after
// its successor began; no lease prevents that. Fencing does: send
// Term.Token with every write, and have the downstream system reject a token
// lower than the highest it has seen. Per-backend details: docs/guarantees.md.
//
// # Using it
//
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report"})
//	err = e.Run(ctx, func(ctx context.Context, t baton.Term) error {
//		return doLeaderWork(ctx, t.Token()) // stop when ctx is cancelled
//	})
//
// b is a Backend: backend/etcd, backend/zookeeper, backend/consul,
// backend/raft in production, backend/memory in tests. The callback's context
// is cancelled when the term ends, or StopEarly before safe-until when
// renewals lag (the cause wraps ErrStoppedEarly); Run waits for the callback
// to return, releases the lease, and campaigns again.
//
// A program that holds Terms itself, or runs many leases, uses the two steps
// Run is made of: Campaign (campaign with a Backoff, stop on what no retry
// fixes) and Lead (run the work under one term, stop it when the term ends,
// StopEarly fires or a resign is requested, wait for it, resign). Package
// balance, package gocronbaton and `baton run` are built on them.
//
// # Observing
//
// Each question has one answer:
//
//   - Do leader-only work: the callback's context, and Term.Token for each
//     write. Stop when the context ends; context.Cause says why.
//   - Follow every transition (a metric, a log line, a readiness flag):
//     ElectorConfig.OnElected and OnDemoted, called in order and never
//     dropped, OnDemoted with the reason (ErrResigned, ErrLeaseLost, ...).
//     There is no event channel: a buffered one drops events when its
//     reader is slow, and a hook cannot.
//   - Does this instance lead now, and with which term (a health check, a
//     status page): Elector.Status; Status.Leader and Status.Term. It does
//     not contact the backend. Package health serves it over HTTP
//     (/v1/health/leader: 200, 429, 503).
//   - Wait until this instance leads (a leader-only endpoint that blocks):
//     Elector.Await.
//   - Who leads, from any instance: Elector.Leader asks the backend once;
//     Elector.WatchLeader follows it as it changes (a standby's log, a
//     proxy to the leader).
//   - A program that holds a Term itself: Term.Done and Term.Err.
//
// Backend authors: package backend holds the kit (the record-store loop,
// the session skeleton, epoch tokens, BasicTerm, Config) and batontest the
// conformance suite; docs/backends/writing.md works an example through.
// Package baton imports no backend.
package baton
