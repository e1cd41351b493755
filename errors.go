package baton

import (
	"errors"
	"strings"
)

// Sentinel errors. Term.Err and OnDemoted's reason wrap one of the loss reasons, so
// callers test them with errors.Is, never by comparing strings.
var (
	// ErrNoLeader is returned by Leader when nobody holds the lease.
	ErrNoLeader = errors.New("baton: no leader")

	// ErrResigned ends a term that its holder gave up on purpose: Resign was
	// called, the Elector's callback returned, or the Elector was stopped;
	// also after a resign requested from outside (ResignRequestTerm), once
	// the holder stopped its work and resigned.
	ErrResigned = errors.New("baton: resigned")

	// ErrLeaseLost ends a term that the backend says is over: the session expired
	// on the server, another candidate took the lease, or an operator deleted it.
	ErrLeaseLost = errors.New("baton: lease lost")

	// ErrExpired ends a term whose safe-until deadline passed before a renewal was
	// confirmed. The holder cannot know whether the lease is still its own, so it
	// stops acting. It usually wraps the last renewal error.
	ErrExpired = errors.New("baton: lease expired before a renewal was confirmed")

	// ErrStoppedEarly is what the cause of the work's context wraps
	// (context.Cause) when Lead (under an Elector, a balance.Group, ...)
	// stops the work StopEarly before the term's safe-until because no
	// renewal was confirmed. The term has not ended yet: it still holds the
	// lease until safe-until, so the work has StopEarly left to wind down
	// before anyone else can take over.
	ErrStoppedEarly = errors.New("baton: renewals lag: stopping the work before safe-until")

	// ErrBackendUnavailable reports that the backend could not be reached.
	// Campaign and Leader wrap it with the underlying cause.
	ErrBackendUnavailable = errors.New("baton: backend unavailable")

	// ErrClosed is returned by a backend's methods after its Close, and ends the
	// terms that were still held when it closed.
	ErrClosed = errors.New("baton: backend closed")

	// ErrAlreadyCampaigning is returned by Campaign when the same candidate
	// is already campaigning for, or holding, the same lease on the same
	// Backend. Other candidates of the Backend for that lease wait their
	// turn instead.
	ErrAlreadyCampaigning = errors.New("baton: already campaigning for this lease")
)

// ConfigError lists every problem found in a configuration at once, so that a
// user fixes them in one go instead of one per run.
type ConfigError struct {
	// Problems are the individual findings, each naming the field, the bad
	// value and the fix.
	Problems []string
}

// Error implements error.
func (e *ConfigError) Error() string {
	return "baton: invalid configuration: " + strings.Join(e.Problems, "; ")
}

// add records a problem; it keeps Validate functions flat.
func (e *ConfigError) add(p string) { e.Problems = append(e.Problems, p) }

// errOrNil returns e as an error only when it holds problems, avoiding the
// typed-nil-in-interface trap.
func (e *ConfigError) errOrNil() error {
	if len(e.Problems) == 0 {
		return nil
	}
	return e
}
