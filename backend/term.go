package backend

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton"
)

// BasicTerm is a ready-made Term for backend authors. The backend creates it
// when it acquires a lease, calls Extend after each confirmed renewal, End
// when the store says the lease is gone, and RequestResign when the store
// relays a request that the holder resign; BasicTerm ends itself with
// baton.ErrExpired when SafeUntil passes without an Extend (the terms that
// SessionTerms starts share its one timer instead of a timer each). It implements
// baton.ResignRequestTerm. Safe for concurrent use.
type BasicTerm struct {
	lease   string
	token   uint64
	release func(context.Context) error
	done    chan struct{}
	resignQ chan struct{} // closed by RequestResign

	mu        sync.Mutex
	safeUntil time.Time
	err       error
	renewErr  error
	timer     *time.Timer // nil for a term that SessionTerms times
	released  bool
	relErr    error
	// relDone, made when Resign begins the release, is closed when the
	// release function returned.
	relDone chan struct{}
	reqErr  error    // RequestResign's reason; nil until then
	onEnd   []func() // run, each in a goroutine of its own, when the term ends
}

var _ baton.ResignRequestTerm = (*BasicTerm)(nil)

// NewBasicTerm starts a term of lease with token, safe until safeUntil (which
// must carry a monotonic clock reading). release gives the lease back to the
// store; Resign calls it at most once, after the term has ended. release may
// be nil.
func NewBasicTerm(lease string, token uint64, safeUntil time.Time, release func(context.Context) error) *BasicTerm {
	t := newTerm(lease, token, safeUntil, release)
	t.mu.Lock()
	t.timer = time.AfterFunc(time.Until(safeUntil), t.expire)
	t.mu.Unlock()
	return t
}

// newTerm is NewBasicTerm without the term's own timer: the caller ends the
// term by its safe-until (SessionTerms does, with one timer for all the
// terms of a session).
func newTerm(lease string, token uint64, safeUntil time.Time, release func(context.Context) error) *BasicTerm {
	return &BasicTerm{
		lease:     lease,
		token:     token,
		release:   release,
		done:      make(chan struct{}),
		resignQ:   make(chan struct{}),
		safeUntil: safeUntil,
	}
}

// expire runs at the deadline it was armed for; a renewal may have moved the
// deadline since, in which case it re-arms instead of ending the term.
func (t *BasicTerm) expire() {
	t.mu.Lock()
	if t.err != nil {
		t.mu.Unlock()
		return
	}
	if left := time.Until(t.safeUntil); left > 0 {
		t.timer.Reset(left)
		t.mu.Unlock()
		return
	}
	t.endLocked(expiredErr(t.renewErr))
	t.mu.Unlock()
}

// expiredErr is the error of a term that reached its safe-until; renewErr
// is the latest renewal failure, or nil.
func expiredErr(renewErr error) error {
	if renewErr != nil {
		return fmt.Errorf("%w (last renewal error: %w)", baton.ErrExpired, renewErr)
	}
	return baton.ErrExpired
}

// expireIfDue ends the term with baton.ErrExpired if its safe-until has
// passed at now, and reports whether the term has ended.
func (t *BasicTerm) expireIfDue(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return true
	}
	if now.Before(t.safeUntil) {
		return false
	}
	t.endLocked(expiredErr(t.renewErr))
	return true
}

// Lease implements baton.Term.
func (t *BasicTerm) Lease() string { return t.lease }

// Token implements baton.Term.
func (t *BasicTerm) Token() uint64 { return t.token }

// SafeUntil implements baton.Term.
func (t *BasicTerm) SafeUntil() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.safeUntil
}

// Done implements baton.Term.
func (t *BasicTerm) Done() <-chan struct{} { return t.done }

// Err implements baton.Term.
func (t *BasicTerm) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// ResignRequested implements baton.ResignRequestTerm.
func (t *BasicTerm) ResignRequested() <-chan struct{} { return t.resignQ }

// RequestResign records that a resign of the term was requested from
// outside the holding process, and closes the ResignRequested channel. It
// does not end the term or release the lease: the holder stops its work,
// then calls Resign, which ends the term with reason (it should wrap
// baton.ErrResigned and say who asked) and releases. It reports whether this call
// made the request: false when one was made before or the term has ended.
func (t *BasicTerm) RequestResign(reason error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil || t.reqErr != nil {
		return false
	}
	if reason == nil {
		reason = baton.ErrResigned
	}
	t.reqErr = reason
	close(t.resignQ)
	return true
}

// Extend moves SafeUntil forward to safeUntil after a confirmed renewal. A
// deadline earlier than the current one is ignored, because a late reply to an
// old renewal must not shorten a newer promise. It reports whether the term is
// still running.
func (t *BasicTerm) Extend(safeUntil time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return false
	}
	if safeUntil.After(t.safeUntil) {
		t.safeUntil = safeUntil
	}
	t.renewErr = nil
	return true
}

// RenewFailed records err as the latest renewal failure; if the term then
// expires, Err wraps it beside baton.ErrExpired.
func (t *BasicTerm) RenewFailed(err error) {
	t.mu.Lock()
	t.renewErr = err
	t.mu.Unlock()
}

// End ends the term with reason err (which should wrap one of baton's
// loss sentinels) and reports whether this call ended it; only the first
// reason is kept.
func (t *BasicTerm) End(err error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.endLocked(err)
}

func (t *BasicTerm) endLocked(err error) bool {
	if t.err != nil {
		return false
	}
	t.err = err
	if t.timer != nil {
		t.timer.Stop()
	}
	close(t.done)
	for _, f := range t.onEnd {
		go f()
	}
	t.onEnd = nil
	return true
}

// AfterEnd arranges for f to run in a goroutine of its own once the term
// ends, at once if it has ended: for a backend that handles the end of
// each term without a goroutine per term waiting on Done.
func (t *BasicTerm) AfterEnd(f func()) { t.afterEnd(f) }

// afterEnd arranges for f to run in a goroutine of its own once the term
// ends, at once if it has ended: what a goroutine waiting on Done would do,
// without a goroutine per term for as long as the term lasts.
func (t *BasicTerm) afterEnd(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		go f()
		return
	}
	t.onEnd = append(t.onEnd, f)
}

// Resign implements baton.Term: it ends the term with baton.ErrResigned, or with the
// reason given to RequestResign (unless it had already ended for another
// reason), then calls the release function once.
// Release runs even after a loss or an expiry: the store may still hold
// something of ours — an expired holder's key on a session that recovered —
// and release functions only remove what is still this term's. A second
// Resign returns the first one's result.
func (t *BasicTerm) Resign(ctx context.Context) error {
	t.mu.Lock()
	reason := baton.ErrResigned
	if t.reqErr != nil {
		reason = t.reqErr
	}
	t.endLocked(reason)
	if t.released {
		err := t.relErr
		t.mu.Unlock()
		return err
	}
	t.released = true
	t.relDone = make(chan struct{})
	t.mu.Unlock()
	var err error
	if t.release != nil {
		err = t.release(ctx)
	}
	t.mu.Lock()
	t.relErr = err
	close(t.relDone)
	t.mu.Unlock()
	return err
}

// releasing returns a channel that is closed when the release that Resign
// began returns, or nil when no release runs (Resign was not called, or
// its release returned). The store may hold the lease for the session
// until then: another campaign of the Backend must not start on the same
// session meanwhile, or it could take the ending term's place, and token,
// for its own.
func (t *BasicTerm) releasing() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.released {
		return nil
	}
	select {
	case <-t.relDone:
		return nil
	default:
		return t.relDone
	}
}
