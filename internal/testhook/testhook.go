// Package testhook reaches operations that only this module's tests and
// benchmarks need, so that the packages that have them need not export
// them. The packages set the hooks when they are initialised.
package testhook

// KillRaftNode stops a *raft.Node (package backend/raft) at once, without
// leaving its group or ending its sessions, as a crash of its process
// would. It panics when given anything else.
var KillRaftNode func(node any) error
