package backend

import (
	"context"
	"sync"
	"time"
)

// SessionTerms is one server session's safe-until, the live terms riding on it,
// and why it ended. Safe for concurrent use.
type SessionTerms struct {
	mu        sync.Mutex
	safeUntil time.Time
	terms     map[*BasicTerm]struct{}
	lastErr   error // the latest renewal failure, nil after a success
	err       error // why the session ended; nil while it lasts
	// settled, made by Lagging while the session lags, is closed by the
	// next confirmed renewal or the session's end.
	settled chan struct{}
	// timer, armed while terms ride on the session, ends them when
	// safe-until passes without a renewal: one timer for all of them, as
	// they share the session's safe-until.
	timer *time.Timer
	armed bool
	// caps are the terms whose safe-until may not pass a deadline of
	// their own until Uncap (StartCapped): terms the process holds without
	// having sent the request that made them its own.
	caps map[*BasicTerm]time.Time
}

// NewSessionTerms returns the state of a session confirmed until safeUntil.
func NewSessionTerms(safeUntil time.Time) *SessionTerms {
	return &SessionTerms{safeUntil: safeUntil, terms: map[*BasicTerm]struct{}{}}
}

// Err returns why the session ended, or nil while it lasts.
func (s *SessionTerms) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Start begins a term of lease with token, riding on the session, and
// reports false (starting nothing) when the session ended or its safe-until
// passed. release is the term's release function (see NewBasicTerm).
func (s *SessionTerms) Start(lease string, token uint64, release func(context.Context) error) (*BasicTerm, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || !time.Now().Before(s.safeUntil) {
		return nil, false
	}
	t := newTerm(lease, token, s.safeUntil, release)
	s.terms[t] = struct{}{}
	s.armLocked()
	return t, true
}

// StartCapped is Start for a term whose safe-until must not pass capUntil
// whatever the session's renewals confirm, until Uncap: a term the store
// granted the process without a request of its own that covers it.
func (s *SessionTerms) StartCapped(lease string, token uint64, release func(context.Context) error, capUntil time.Time) (*BasicTerm, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.err != nil || !now.Before(s.safeUntil) || !now.Before(capUntil) {
		return nil, false
	}
	t := newTerm(lease, token, minTime(s.safeUntil, capUntil), release)
	s.terms[t] = struct{}{}
	if s.caps == nil {
		s.caps = map[*BasicTerm]time.Time{}
	}
	s.caps[t] = capUntil
	if s.armed {
		s.timer.Stop()
		s.armed = false
	}
	s.armLocked()
	return t, true
}

// Uncap lifts t's cap (StartCapped) once a request that covers t's key,
// sent at a time that gives until, was confirmed: t's safe-until moves to
// until, or the session's safe-until if that is earlier.
func (s *SessionTerms) Uncap(t *BasicTerm, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.caps[t]; !ok {
		return
	}
	delete(s.caps, t)
	if _, ok := s.terms[t]; ok {
		t.Extend(minTime(until, s.safeUntil))
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// deadlineLocked is the earliest safe-until of the session's terms: the
// session's, or a capped term's cap.
func (s *SessionTerms) deadlineLocked() time.Time {
	d := s.safeUntil
	for t, c := range s.caps {
		if _, ok := s.terms[t]; !ok {
			delete(s.caps, t)
			continue
		}
		d = minTime(d, c)
	}
	return d
}

// armLocked makes sure the timer fires at the earliest deadline.
func (s *SessionTerms) armLocked() {
	if s.armed {
		return
	}
	s.armed = true
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(s.deadlineLocked()), s.expire)
		return
	}
	s.timer.Reset(time.Until(s.deadlineLocked()))
}

// expire runs at the safe-until the timer was armed for. A renewal may have
// moved safe-until since: then it re-arms. Otherwise it ends every term
// whose safe-until passed (baton.ErrExpired, with the latest renewal
// failure), as a NewBasicTerm's own timer does; the session ends when
// its renewals give up (keepAlive).
func (s *SessionTerms) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = false
	if s.err != nil || len(s.terms) == 0 {
		return
	}
	if time.Until(s.deadlineLocked()) > 0 {
		s.armLocked()
		return
	}
	now := time.Now()
	for t := range s.terms {
		if t.expireIfDue(now) {
			delete(s.terms, t)
		}
	}
	if len(s.terms) > 0 {
		s.armLocked()
	}
}

// Forget stops extending t, whose term has ended.
func (s *SessionTerms) Forget(t *BasicTerm) {
	s.mu.Lock()
	delete(s.terms, t)
	s.mu.Unlock()
}

// Extend moves the session's safe-until, and every live term's, to until.
func (s *SessionTerms) Extend(until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until.After(s.safeUntil) {
		s.safeUntil = until
	}
	s.lastErr = nil
	s.settleLocked()
	for t := range s.terms {
		u := until
		if c, ok := s.caps[t]; ok {
			u = minTime(u, c)
		}
		if !t.Extend(u) {
			delete(s.terms, t)
			delete(s.caps, t)
		}
	}
}

// RenewFailed records a failed renewal; the terms report it if they expire.
func (s *SessionTerms) RenewFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	for t := range s.terms {
		t.RenewFailed(err)
	}
}

// Lagging returns nil while the session's renewals keep up: the latest
// one tried was confirmed (or none has been tried yet) and at least minLeft
// is left before safe-until. Otherwise (the latest renewal failed, or one
// is overdue) it returns a channel that is closed by the next confirmed
// renewal or by the session's end. A lagging session's safe-until is
// still measured from its last confirmed renewal, so a term started on it
// is born with that old deadline: a campaign waits on the channel instead,
// and rides on the renewed session or, once this one ended, a new one.
// A minLeft of zero or less checks failures only.
func (s *SessionTerms) Lagging(minLeft time.Duration) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || (s.lastErr == nil && time.Until(s.safeUntil) >= minLeft) {
		return nil
	}
	if s.settled == nil {
		s.settled = make(chan struct{})
	}
	return s.settled
}

// settleLocked wakes whoever waits on Lagging's channel.
func (s *SessionTerms) settleLocked() {
	if s.settled != nil {
		close(s.settled)
		s.settled = nil
	}
}

// End ends the session and its terms with err. It reports false when the
// session had already ended.
func (s *SessionTerms) End(err error) bool {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return false
	}
	s.err = err
	terms := s.terms
	s.terms = nil
	s.settleLocked()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	for t := range terms {
		t.End(err)
	}
	return true
}

// renewIn returns how long to wait before the next renewal: interval, but
// early enough to leave half an interval (two retries, which come every
// interval/4) or, when less is left, half the time left before safe-until,
// so that renewals are still tried before the deadline when the last
// confirmation was slow. A renewal confirmed in time is thus followed by
// the next one interval later, whatever share of the span the interval
// is. Past the deadline it returns a moment, for keepAlive to notice.
func (s *SessionTerms) renewIn(interval time.Duration) time.Duration {
	s.mu.Lock()
	left := time.Until(s.safeUntil)
	s.mu.Unlock()
	return max(min(interval, max(left-interval/2, left/2)), time.Millisecond)
}

// renewal says how keepAlive renews a session and what it does when that
// fails.
type renewal struct {
	// Interval is the time between renewals (Config.RenewInterval);
	// after a failure keepAlive retries four times as often.
	Interval time.Duration
	// Renew renews the session once, within ctx (which ends at the current
	// safe-until), and returns the new safe-until, measured from when the
	// renewal was sent.
	Renew func(ctx context.Context) (time.Time, error)
	// Gone reports whether a Renew error means the server no longer has
	// the session.
	Gone func(error) bool
	// Expired runs, and keepAlive returns, when safe-until passed without
	// a confirmed renewal; lastErr is the last renewal's error.
	Expired func(lastErr error)
	// Lost runs, and keepAlive returns, when Renew's error is Gone.
	Lost func(err error)
	// Failed runs after any other failed renewal, with the time left
	// before safe-until.
	Failed func(err error, left time.Duration)
}

// keepAlive renews the session until ctx ends, it expires, or the server
// reports it gone. Each renewal is bounded by the current safe-until, after
// which it would be useless.
func (s *SessionTerms) keepAlive(ctx context.Context, r renewal) {
	next := s.renewIn(r.Interval)
	for {
		timer := time.NewTimer(next)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		s.mu.Lock()
		deadline, lastErr := s.safeUntil, s.lastErr
		s.mu.Unlock()
		if !time.Now().Before(deadline) {
			r.Expired(lastErr)
			return
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		until, err := r.Renew(rctx)
		cancel()
		switch {
		case err == nil:
			s.Extend(until)
			next = s.renewIn(r.Interval)
		case r.Gone(err):
			r.Lost(err)
			return
		case ctx.Err() != nil:
			return
		default:
			s.RenewFailed(err)
			r.Failed(err, time.Until(deadline))
			next = s.renewIn(r.Interval / 4)
		}
	}
}
