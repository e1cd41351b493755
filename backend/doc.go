// Package backend is the kit for writing a baton backend, and the timing
// every backend shares. Application authors need only its Config, to set a
// backend's TTL; everything else here is for backend authors. Package baton
// holds what applications use (Elector, Term, the errors); the backends in
// this module (backend/etcd, backend/zookeeper, backend/consul, backend/raft,
// backend/cas and backend/memory) are built with this kit.
//
// # What a backend must guarantee
//
// A backend implements baton.Backend, and its Terms keep the promises
// written on baton.Term:
//
//   - one holder per lease at a time, and a fencing token that strictly
//     increases across the terms of a lease, also after the store lost its
//     data (fold in an epoch: docs/guarantees.md, "Tokens across a lost
//     store");
//   - SafeUntil is the start of the last confirmed renewal plus the TTL
//     minus Config.DriftMargin (Config.SafeUntil computes it), on the
//     holder's monotonic clock, and the term ends by itself at that
//     deadline, even when the store cannot be reached;
//   - a contender takes a lease over only after the store reports the
//     holder's session dead, or after it has itself seen the lease
//     unrenewed for a full TTL;
//   - Campaign's context bounds the wait, never the term, and a cancelled
//     campaign leaves nothing behind that could later make it leader.
//
// The conformance suite in package batontest checks these against a real
// server: every backend runs batontest.Run.
//
// # The kit
//
// BasicTerm is a ready-made Term: create it with NewBasicTerm when the
// lease is won, call Extend after each confirmed renewal, RenewFailed when
// one fails, End when the store says the lease is gone, and RequestResign
// when the store relays a request that the holder resign. Config is
// embedded in each backend's options; WithDefaults fills in and checks it.
// A backend that keeps lease state (baton.StateTerm) calls CheckStateSize
// and EndedError first thing in StoreState.
//
// Package backend imports only package baton and the standard library,
// never a backend.
package backend
