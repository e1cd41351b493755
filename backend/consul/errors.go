package consul

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/batonhq/baton"
	"github.com/hashicorp/consul/api"
)

var (
	// ErrKeyConflict is wrapped by the errors of Campaign and Leader when a
	// lease's key holds something other than a `consul lock` lock: most
	// often the semaphore of `consul lock -n N` (N > 1) on the same prefix,
	// which baton must neither take nor overwrite. api.Lock refuses such a
	// key in the same way (api.ErrLockConflict).
	ErrKeyConflict = errors.New("consul: key is in use by something other than a lock")

	// ErrPermissionDenied is wrapped by the errors of requests that Consul's
	// ACLs refused: the token (api.Config.Token) lacks session:write on the
	// agent's node or key:write on the prefix. See the package doc for a
	// policy.
	ErrPermissionDenied = errors.New("consul: permission denied by ACL")

	// errSessionGone is what a renewal reports when Consul no longer knows
	// the session.
	errSessionGone = errors.New("consul: session is gone")
)

// conflictErr says why a key at the lock's place is not one.
func conflictErr(key string, flags uint64) error {
	return fmt.Errorf("%w: %s has flags %#x, not the lock flag %#x: another tool (a `consul lock -n N` semaphore, say) uses this prefix; "+
		"baton and consul lock share a lease only with -n 1 (the default)", ErrKeyConflict, key, flags, uint64(api.LockFlagValue))
}

// permissionErr wraps err with ErrPermissionDenied when Consul answered 403.
func permissionErr(err error) error {
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusForbidden {
		return fmt.Errorf("%w: %w", ErrPermissionDenied, err)
	}
	return err
}

// SessionTTLError is returned (wrapped) by Campaign when the Consul servers
// refuse the session TTL the Backend asks for (TTL/2): it is below their
// session_ttl_min (10 s unless configured) or above 24 h. Retrying cannot
// fix it, so it also matches *baton.ConfigError with errors.As, and the
// Elector returns it instead of campaigning again.
type SessionTTLError struct {
	// SessionTTL is the session TTL that was asked for.
	SessionTTL time.Duration
	// Err is Consul's answer, which names the range it accepts.
	Err error
}

func (e *SessionTTLError) problem() string {
	return fmt.Sprintf("consul: the servers refuse session TTL %s (TTL/2): %v; Consul servers accept session TTLs from their session_ttl_min (10s by default) to 24h: set TTL to at least twice session_ttl_min (20s by default), or lower session_ttl_min on the servers",
		e.SessionTTL, e.Err)
}

// Error implements error.
func (e *SessionTTLError) Error() string { return e.problem() }

// Unwrap returns Consul's error and the *baton.ConfigError this is.
func (e *SessionTTLError) Unwrap() []error {
	return []error{e.Err, &baton.ConfigError{Problems: []string{e.problem()}}}
}
