package etcd

import (
	"fmt"
	"time"

	"github.com/batonhq/baton"
)

// TTLError is returned (wrapped) by Campaign when the etcd servers refuse
// the session lease's TTL as too large. New already refuses a TTL above
// MaxTTL, etcd's own limit, so only a server with another limit (a proxy
// or a fork) gives it. Retrying cannot fix it, so it also matches
// *baton.ConfigError with errors.As, and the Elector returns it instead
// of campaigning again.
type TTLError struct {
	// TTL is the lease TTL that was asked for, in whole seconds.
	TTL time.Duration
	// Err is etcd's answer.
	Err error
}

func (e *TTLError) problem() string {
	return fmt.Sprintf("etcd: the servers refuse lease TTL %s: %v; etcd grants at most %s (%d s) unless its servers say otherwise: lower TTL",
		e.TTL, e.Err, MaxTTL, int64(MaxTTL/time.Second))
}

// Error implements error.
func (e *TTLError) Error() string { return e.problem() }

// Unwrap returns etcd's error and the *baton.ConfigError this is.
func (e *TTLError) Unwrap() []error {
	return []error{e.Err, &baton.ConfigError{Problems: []string{e.problem()}}}
}
