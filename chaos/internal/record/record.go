// Package record holds what a chaos run records: the writes the fenced store
// received from the candidates' children, and the faults the nemesis
// injected. The checker reads these and nothing else, so that a saved run
// can be checked again.
package record

import "time"

// Write is one write a child sent to the fenced store. Every child writes
// every Run.Heartbeat while it runs, so a child's writes are also its
// heartbeats.
type Write struct {
	// At is when the store received the write, on the harness's monotonic
	// clock, from the start of the run.
	At time.Duration `json:"at"`
	// Candidate is the id of the `baton run` whose child wrote ("c1").
	Candidate string `json:"candidate"`
	// Token is BATON_TOKEN of the child's term.
	Token uint64 `json:"token,string"`
	// PID is the child's process id: one child is one term of one candidate.
	PID int `json:"pid"`
	// Seq counts the child's writes from 1; a gap means writes lost in flight.
	Seq int64 `json:"seq"`
	// Accepted reports whether the store took the write: it refuses a
	// token lower than the highest it has accepted.
	Accepted bool `json:"accepted"`
}

// Fault is one fault the nemesis injected.
type Fault struct {
	// ID numbers faults from 1 in the order they were injected.
	ID int `json:"id"`
	// Kind is the fault's kind, e.g. "kill", "stop-tree"; see the harness's
	// list of kinds.
	Kind string `json:"kind"`
	// Target names what the fault hit: a candidate ("c2"), a raft member,
	// or "backend".
	Target string `json:"target"`
	// Holder is the candidate that held the lease when the fault began, as
	// the store saw it last ("" if none).
	Holder string `json:"holder,omitempty"`
	// Start is when the fault was injected, and End when it was healed
	// (the process resumed or restarted, the network healed, the backend
	// back), on the run's clock. End == Start for a fault with nothing to
	// heal.
	Start time.Duration `json:"start"`
	End   time.Duration `json:"end"`
	// Paused reports a fault that stopped a candidate's child together with
	// its guard (SIGSTOP of the whole process tree): nothing on the
	// machine can stop such a child from acting late, only fencing can.
	Paused bool `json:"paused,omitempty"`
	// Note says anything else worth knowing, e.g. the latency added.
	Note string `json:"note,omitempty"`
}

// Run describes a run: enough to reproduce it and to read its figures.
type Run struct {
	// Backend is the backend's name: "etcd", "zookeeper", "consul", "raft".
	Backend string `json:"backend"`
	// Seed seeds the nemesis's schedule (the kinds, times and durations of
	// faults); the targets follow the run (the holder at that moment).
	Seed int64 `json:"seed"`
	// Command is the command line that reproduces the run.
	Command string `json:"command"`
	// Candidates is the number of `baton run` candidates.
	Candidates int `json:"candidates"`
	// TTL is the lease TTL given to the candidates, Grace their --grace.
	TTL   time.Duration `json:"ttl"`
	Grace time.Duration `json:"grace"`
	// Heartbeat is how often each child writes.
	Heartbeat time.Duration `json:"heartbeat"`
	// RecoveryBudget is how long after a fault ends the run may go without
	// a leader before the time counts against availability.
	RecoveryBudget time.Duration `json:"recovery_budget"`
	// Duration is the length of the run, from its start to the last write.
	Duration time.Duration `json:"duration"`
	// Broken names the deliberately broken build the run used, if any.
	Broken string `json:"broken,omitempty"`
	// Started is the wall-clock time the run started, for the report only.
	Started time.Time `json:"started"`
}

// History is everything a run recorded.
type History struct {
	Run    Run     `json:"run"`
	Writes []Write `json:"writes"`
	Faults []Fault `json:"faults"`
	// Exits lists the candidates' exits that no fault caused ("c2: exit
	// status 1 at 12.5s"): baton giving up or crashing. The harness
	// restarts the candidate; the check reports them.
	Exits []string `json:"exits,omitempty"`
}
