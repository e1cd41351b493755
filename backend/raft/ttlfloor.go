package raft

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// MinTTL returns the shortest session TTL that a group whose members use
// heartbeatTimeout (0: DefaultHeartbeatTimeout) can honour at the default
// RenewInterval (TTL/3) and DriftMargin (TTL/10), rounded up to 10 ms:
// 2.21 s at the default heartbeat timeout of 1.25 s. It is the TTL whose
// renewal window (TTL − RenewInterval − DriftMargin) is one heartbeat
// timeout, the floor CheckTiming enforces; see CheckTiming for why.
func MinTTL(heartbeatTimeout time.Duration) time.Duration {
	if heartbeatTimeout <= 0 {
		heartbeatTimeout = DefaultHeartbeatTimeout
	}
	// The window at the default ratios is TTL·(1 − 1/3 − 1/10) = 17/30 TTL.
	const step = 10 * time.Millisecond
	ttl := (heartbeatTimeout*30 + 16) / 17
	ttl = (ttl + step - 1) / step * step
	for {
		// Integer division in the defaults may leave the window a few
		// nanoseconds short: step up until it is not.
		c, err := (backend.Config{TTL: ttl}).WithDefaults()
		if err == nil && c.TTL-c.RenewInterval-c.DriftMargin >= heartbeatTimeout {
			return ttl
		}
		ttl += step
	}
}

// CheckTiming returns a *TTLError when cfg (defaults applied as New applies
// them) leaves a renewal window (TTL − RenewInterval − DriftMargin)
// shorter than heartbeatTimeout (0: DefaultHeartbeatTimeout), the raft
// heartbeat timeout of the group's members, and nil otherwise.
//
// Why one heartbeat timeout: raft lets its leader go unheard for up to a
// heartbeat timeout before anything happens (a follower campaigns, the
// leader steps down, only after a full one), and the raft leader itself
// counts a follower's reply that comes back up to half of one late and,
// after a stall of its own, confirms nothing for a quarter of one. A
// holder's renewals go unconfirmed through each of those, so a window
// shorter than a heartbeat timeout ends every term the group holds on a
// pause or delay that raft rides out without an election; a term would
// last only while nothing stirs. Safety does not depend on it (no raft
// leader expires a session before its holder's safe-until, whatever the
// TTL): the floor refuses timing that cannot be available.
func CheckTiming(cfg backend.Config, heartbeatTimeout time.Duration) error {
	if heartbeatTimeout <= 0 {
		heartbeatTimeout = DefaultHeartbeatTimeout
	}
	c, err := Options{Config: cfg}.timing()
	if err != nil {
		return err
	}
	window := c.TTL - c.RenewInterval - c.DriftMargin
	if window >= heartbeatTimeout {
		return nil
	}
	return &TTLError{TTL: c.TTL, Window: window, HeartbeatTimeout: heartbeatTimeout, Min: MinTTL(heartbeatTimeout)}
}

// TTLError is returned by New, and by a campaign through an agent client
// whose member refuses to create the session, when the TTL (with the
// RenewInterval and DriftMargin) is too short for the group's raft timing:
// its renewal window is below one heartbeat timeout (see CheckTiming).
// Retrying cannot fix it, so it also matches *baton.ConfigError with
// errors.As, and the Elector returns it instead of campaigning again.
type TTLError struct {
	// TTL is the session TTL asked for.
	TTL time.Duration `json:"ttl"`
	// Window is its renewal window: TTL − RenewInterval − DriftMargin.
	Window time.Duration `json:"window"`
	// HeartbeatTimeout is the heartbeat timeout of the member that
	// judged it.
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout"`
	// Min is MinTTL(HeartbeatTimeout): the shortest TTL that works at the
	// default RenewInterval and DriftMargin.
	Min time.Duration `json:"min_ttl"`
}

func (e *TTLError) problem() string {
	fix := fmt.Sprintf("raise TTL to at least %s", e.Min)
	if e.TTL >= e.Min {
		fix = "renew more often (RenewInterval) or raise TTL"
	}
	return fmt.Sprintf("raft: TTL %s is too short for the group's raft timing: its renewal window (TTL less the renew interval and drift margin) is %s, "+
		"below the heartbeat timeout (%s), so a pause or a late reply that raft rides out without an election would end every term; "+
		"the shortest TTL that works is %s: %s (or lower the members' heartbeat timeout)",
		e.TTL, e.Window.Round(time.Millisecond), e.HeartbeatTimeout, e.Min, fix)
}

// Error implements error.
func (e *TTLError) Error() string { return e.problem() }

// Unwrap returns the *baton.ConfigError this is.
func (e *TTLError) Unwrap() error { return &baton.ConfigError{Problems: []string{e.problem()}} }

// statusTTLRefused is the group API's status for a session TTL the raft
// leader refuses (a *TTLError, as JSON in the body).
const statusTTLRefused = http.StatusUnprocessableEntity

// ttlRefusal returns the *TTLError that an API error of status
// statusTTLRefused carries, or nil.
func ttlRefusal(ae *apiError) *TTLError {
	if ae == nil || ae.Status != statusTTLRefused {
		return nil
	}
	var e TTLError
	if json.Unmarshal([]byte(ae.Msg), &e) != nil || e.TTL <= 0 {
		return nil
	}
	return &e
}
