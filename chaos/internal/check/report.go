// Package check reads the history of a chaos run (internal/chaos/record)
// and reports what it shows: fencing violations, token regressions,
// overlapping leaders, availability outside fault windows, and recovery
// after each kind of fault. It renders the report as JSON and as an SVG
// timeline.
//
// What a passing report means: no write was accepted with a token below one
// accepted before it (fencing held); the terms' tokens rose strictly in the
// order of their first accepted writes; and no two terms' children were active at once,
// except in the documented paused case (a holder stopped together with its
// guard, which only fencing can stop). Availability is a failure only when
// the caller sets Report.MinAvailability: short runs do not measure it
// meaningfully.
//
// Definitions, used throughout:
//
//   - A child is one (candidate, PID, token): one process of one term. It is
//     active from its first write (accepted or not) to its last, through
//     any gap: a paused child is still alive, and may write again.
//   - A term is one (candidate, token). Children of one candidate with one
//     token are restarts within one term (the backend granted that token
//     once); children of two candidates with one token are two terms, and
//     the second is a token regression (not strictly greater).
//   - The leader is active over [At, At+GapTolerance] after each accepted
//     write, GapTolerance = 5 × Heartbeat: a few lost or late heartbeats are
//     not an outage; anything longer is leaderless time.
//   - A fault's window is [Start, End + recovery], where recovery ends when
//     the last leaderless gap that began in [Start, End+RecoveryBudget] ends,
//     capped at End+RecoveryBudget: leaderless time past the budget counts
//     against availability.
package check

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// MaxExamples bounds every list of examples in a Report.
const MaxExamples = 20

// Report is what Check found in a history. It is plain data: JSON-encode it
// with WriteJSON. Durations are in nanoseconds in JSON, like record's.
type Report struct {
	// Backend, Seed, Command and Broken are copied from the run.
	Backend string `json:"backend"`
	Seed    int64  `json:"seed"`
	Command string `json:"command"`
	Broken  string `json:"broken,omitempty"`
	// Started is the run's wall-clock start.
	Started time.Time `json:"started"`
	// Duration is the run's length (the later of Run.Duration and the last
	// write); Heartbeat, TTL and RecoveryBudget are the run's settings
	// (Heartbeat defaulted to DefaultHeartbeat when the run gave none).
	Duration       time.Duration `json:"duration"`
	Heartbeat      time.Duration `json:"heartbeat"`
	TTL            time.Duration `json:"ttl"`
	RecoveryBudget time.Duration `json:"recovery_budget"`
	Candidates     int           `json:"candidates"`

	// Writes counts every write, Accepted and Refused split them.
	Writes   int `json:"writes"`
	Accepted int `json:"accepted"`
	Refused  int `json:"refused"`
	// Children counts (candidate, PID, token) children; Terms counts
	// (candidate, token) terms.
	Children int `json:"children"`
	Terms    int `json:"terms"`
	// Faults counts faults injected, and FaultsByKind by kind.
	Faults       int            `json:"faults"`
	FaultsByKind map[string]int `json:"faults_by_kind"`

	Fencing      Fencing      `json:"fencing"`
	Tokens       Tokens       `json:"tokens"`
	Overlaps     Overlaps     `json:"overlaps"`
	Availability Availability `json:"availability"`
	// Recovery summarises FaultRecovery by fault kind.
	Recovery map[string]KindRecovery `json:"recovery"`
	// FaultRecovery is what each fault did to leadership, in fault order.
	FaultRecovery []FaultRecovery `json:"fault_recovery"`

	// Exits lists the candidates' exits that no fault caused (the
	// harness restarted them). They do not fail the run by themselves: a
	// safety problem they led to shows in the figures above. Each is worth
	// a look in the candidate's log.
	Exits []string `json:"exits,omitempty"`

	// MinAvailability, when above 0, makes Availability.Fraction below it
	// a failure. Check leaves it 0; long runs set it (e.g. 0.999) before
	// calling OK or Failures.
	MinAvailability float64 `json:"min_availability,omitempty"`
}

// TermRef names a term.
type TermRef struct {
	Candidate string `json:"candidate"`
	Token     uint64 `json:"token,string"`
}

// ChildRef names a child.
type ChildRef struct {
	Candidate string `json:"candidate"`
	Token     uint64 `json:"token,string"`
	PID       int    `json:"pid"`
}

// Interval is a span of the run's clock, [Start, End].
type Interval struct {
	Start time.Duration `json:"start"`
	End   time.Duration `json:"end"`
}

// Len is End − Start.
func (i Interval) Len() time.Duration { return i.End - i.Start }

// Fencing is what the store did with stale writes.
type Fencing struct {
	// Violations counts accepted writes whose token was lower than one
	// accepted before them. Must be 0.
	Violations int `json:"violations"`
	// Examples are the first violations.
	Examples []Violation `json:"examples,omitempty"`
	// StaleRefused counts writes the store refused (fencing at work), and
	// StaleRefusedBy by candidate.
	StaleRefused   int            `json:"stale_refused"`
	StaleRefusedBy map[string]int `json:"stale_refused_by"`
	// WronglyRefused counts refused writes whose token was not below the
	// highest accepted: a store that does not follow its own rule, whose
	// record cannot be trusted. Must be 0.
	WronglyRefused int `json:"wrongly_refused"`
}

// Violation is an accepted write with a token below one accepted earlier.
type Violation struct {
	At    time.Duration `json:"at"`
	Write ChildRef      `json:"write"`
	// Highest is the highest token accepted before, and By its term.
	Highest TermRef `json:"highest"`
}

// Tokens is the check of token monotonicity across terms.
type Tokens struct {
	// Accepted counts terms with at least one accepted write; they are
	// ordered by their first accepted write, and each must have a token
	// strictly greater than the one before.
	Accepted int `json:"accepted_terms"`
	// NeverAccepted counts terms whose every write was refused. Such a
	// term began after a higher token was accepted, so its backend granted
	// a lower token later — unless its first write was delayed by a fault
	// on its candidate (a pause between grant and first write). Those
	// delayed ones are counted in Delayed; the others are regressions.
	NeverAccepted int `json:"never_accepted_terms"`
	Delayed       int `json:"delayed_terms"`
	// Regressions counts both kinds of regression. Must be 0.
	Regressions int          `json:"regressions"`
	Examples    []Regression `json:"examples,omitempty"`
}

// Regression is a term whose token is not above its predecessor's.
type Regression struct {
	// At is the term's first accepted write, or its first write for a
	// term never accepted.
	At       time.Duration `json:"at"`
	Term     TermRef       `json:"term"`
	Previous TermRef       `json:"previous"`
	Reason   string        `json:"reason"`
}

// Overlaps are instants at which children of two terms were both active.
type Overlaps struct {
	// Paused counts overlaps explained by a paused fault (see Overlap), and
	// PausedTime sums their lengths.
	Paused     int           `json:"paused"`
	PausedTime time.Duration `json:"paused_time"`
	// Unexplained counts the others. Must be 0.
	Unexplained     int           `json:"unexplained"`
	UnexplainedTime time.Duration `json:"unexplained_time"`
	// Examples lists the first unexplained overlaps, then the first paused
	// ones, up to MaxExamples each.
	Examples []Overlap `json:"examples,omitempty"`
}

// Overlap is two children of different terms active at once.
type Overlap struct {
	Interval
	// Stale is the child with the lower token (on a tie, the one that began
	// first), Newer the other.
	Stale ChildRef `json:"stale"`
	Newer ChildRef `json:"newer"`
	// PausedBy is the ID of the paused fault that explains the overlap: a
	// fault with Paused set, targeting either child's candidate, whose
	// window [Start, End+PauseSlack(Heartbeat)] contains the overlap's
	// start. 0 for an unexplained overlap.
	PausedBy int `json:"paused_by,omitempty"`
	// StaleAccepted counts the stale child's writes after the overlap began
	// (up to its end) that the store accepted (each also a fencing violation when a higher token
	// had been accepted).
	StaleAccepted int `json:"stale_accepted"`
}

// Availability is leadership over the run, outside and inside fault
// windows.
type Availability struct {
	// GapTolerance is how long after an accepted write the leader counts as
	// active: 5 × Heartbeat.
	GapTolerance time.Duration `json:"gap_tolerance"`
	// Span is what is measured: from the first accepted write (before it,
	// the first election; Startup is its length) to the end of the run.
	Span    Interval      `json:"span"`
	Startup time.Duration `json:"startup"`
	// Inside is the time within fault windows, Outside the rest of Span.
	Inside  time.Duration `json:"inside"`
	Outside time.Duration `json:"outside"`
	// ActiveOutside is the time with an active leader outside fault
	// windows; Fraction = ActiveOutside / Outside (1 when Outside is 0).
	ActiveOutside time.Duration `json:"active_outside"`
	Fraction      float64       `json:"fraction"`
	// Overall is the fraction of Span with an active leader, windows
	// included.
	Overall float64 `json:"overall"`
	// Leaderless counts the leaderless intervals outside fault windows,
	// LeaderlessTime sums them, Longest is the longest, and Examples the
	// first of them.
	Leaderless     int           `json:"leaderless"`
	LeaderlessTime time.Duration `json:"leaderless_time"`
	Longest        Interval      `json:"longest"`
	Examples       []Interval    `json:"examples,omitempty"`
}

// FaultRecovery is what one fault did to leadership.
type FaultRecovery struct {
	ID     int           `json:"id"`
	Kind   string        `json:"kind"`
	Target string        `json:"target"`
	Start  time.Duration `json:"start"`
	End    time.Duration `json:"end"`
	// Window is the fault's window (see the package doc).
	Window Interval `json:"window"`
	// Interrupted reports leaderless gaps beginning within [Start,
	// End+TTL] (the fault's doing), or one that began before Start and
	// still lasted at End (the fault prolonged it); Leaderless sums their
	// whole lengths.
	Interrupted bool          `json:"interrupted"`
	Leaderless  time.Duration `json:"leaderless"`
	// Recovery is the time from Start to the accepted write that ended the
	// last of those gaps (0 when not interrupted). Recovered is false when
	// the run ended still leaderless; Recovery then runs to the run's end.
	Recovery  time.Duration `json:"recovery"`
	Recovered bool          `json:"recovered"`
	// From is the term leading when the fault began (empty if none), To
	// the next term to have a write accepted, by End+RecoveryBudget.
	// HandOver is the time from From's last accepted write to To's first:
	// the hand-over the fault caused, with or without a gap (0 if none).
	From     TermRef       `json:"from"`
	To       TermRef       `json:"to"`
	HandOver time.Duration `json:"hand_over"`
}

// KindRecovery summarises the faults of one kind.
type KindRecovery struct {
	// Faults counts them; Interrupted those that interrupted leadership;
	// Unrecovered those after which the run ended leaderless; HandedOver
	// those after which another term led.
	Faults      int `json:"faults"`
	Interrupted int `json:"interrupted"`
	Unrecovered int `json:"unrecovered"`
	HandedOver  int `json:"handed_over"`
	// Recovery and Leaderless are over the interrupted faults, HandOver
	// over the handed-over ones.
	Recovery   Dist `json:"recovery"`
	Leaderless Dist `json:"leaderless"`
	HandOver   Dist `json:"hand_over"`
}

// Dist is a distribution of durations: nearest-rank percentiles.
type Dist struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50"`
	P90  time.Duration `json:"p90"`
	P99  time.Duration `json:"p99"`
	Max  time.Duration `json:"max"`
	Mean time.Duration `json:"mean"`
}

// Failures lists why the report fails, one sentence each; empty when it
// passes. Fencing violations, a store that refused a valid write, token
// regressions and unexplained overlaps always fail; so does a run in which
// no write was accepted (nothing was checked). Availability fails only
// below MinAvailability.
func (r Report) Failures() []string {
	var f []string
	if r.Accepted == 0 {
		f = append(f, fmt.Sprintf("no write was accepted in %d writes: no leader ever wrote, so nothing was checked", r.Writes))
	}
	if r.Fencing.Violations > 0 {
		f = append(f, fmt.Sprintf("%d fencing violations: writes accepted with a token below one accepted before", r.Fencing.Violations))
	}
	if r.Fencing.WronglyRefused > 0 {
		f = append(f, fmt.Sprintf("%d writes refused although their token was not below the highest accepted: the store broke its rule", r.Fencing.WronglyRefused))
	}
	if r.Tokens.Regressions > 0 {
		f = append(f, fmt.Sprintf("%d token regressions: a term's token not above its predecessor's", r.Tokens.Regressions))
	}
	if r.Overlaps.Unexplained > 0 {
		f = append(f, fmt.Sprintf("%d overlaps outside the paused case (%s in all): two terms' children active at once", r.Overlaps.Unexplained, r.Overlaps.UnexplainedTime))
	}
	if r.MinAvailability > 0 && r.Availability.Fraction < r.MinAvailability {
		f = append(f, fmt.Sprintf("availability outside fault windows %.5f below %.5f (%s leaderless in %d intervals)",
			r.Availability.Fraction, r.MinAvailability, r.Availability.LeaderlessTime, r.Availability.Leaderless))
	}
	return f
}

// OK reports whether Failures is empty.
func (r Report) OK() bool { return len(r.Failures()) == 0 }

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
