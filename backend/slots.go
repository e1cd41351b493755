package backend

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/batonhq/baton"
)

// slots keeps the lease names one Backend campaigns for or holds, one Slot
// per name (see Slot for when a name is claimed), and the candidates of the
// Backend waiting for each name, in line.
//
// Locking: slots is guarded by its SessionManager's mutex, which also guards the
// closed flag (read through the closed function), so that the SessionManager can
// act on a slot and its other state in one critical section: a clean-up,
// say, checks that the SessionManager is not closed, marks the slot and adds
// itself to the wait group at once, so that Close cannot come in between.
// Methods whose names end in Locked are called with the mutex held; the
// others take it themselves and are called without it.
type slots struct {
	mu      sync.Locker
	closed  func() bool
	backend string
	slots   map[string]*Slot // by lease name
	lines   map[string]*line // by lease name, while a claim waits for it
}

// line is the claims waiting for one lease name, first come, first served:
// only the first waits for the name, the others wait to be first. So the
// candidates of one Backend for one name take turns in the process, and the
// store sees one campaign of the Backend per name at a time, whatever the
// number of candidates, and its hand-overs wake one of them.
type line struct {
	waiting []*ticket
	ids     map[string]bool // the candidates waiting
}

// ticket is one claim's place in a line.
type ticket struct {
	id    string
	first chan struct{} // closed once the ticket is first in line
}

// newSlots returns slots guarded by mu (see slots). closed reports, called
// with mu held, whether the SessionManager is closed. backend names the backend in
// Claim's errors ("etcd allows one campaign per lease name per candidate").
func newSlots(mu sync.Locker, closed func() bool, backend string) *slots {
	return &slots{mu: mu, closed: closed, backend: backend, slots: map[string]*Slot{}, lines: map[string]*line{}}
}

// Slot marks a lease name claimed by one campaign of a SessionManager. The
// session backends derive a campaign's key or node from the Backend's one
// session, so two campaigns of one Backend for one name must not overlap;
// nor may a new campaign start while a clean-up after an older one may
// still delete what the new one makes. Claims for a claimed name wait in
// line, first come, first served (see Claim).
//
// A name is claimed from Claim until Unclaim gives it back, or longer:
//
//   - While a clean-up (SessionManager.CleanLater) runs, Unclaim leaves the name
//     claimed, and the next claim for it waits for the clean-up's end, which
//     gives the name back.
//   - Once the campaign won (SessionManager.Start), the next claim for the
//     name waits while the term runs, and takes the slot over once it
//     ended and the release its Resign began (if any) returned: a campaign
//     on the same session while the store still holds the lease for it
//     could take the ended term's place, and token (raft); the backend's
//     campaign copes with what a term that ended otherwise may have left
//     (etcd, ZooKeeper, raft).
//   - Once the campaign won with StartOptions.UntilGone, the next claim
//     also waits, after the term ended, until Gone says that what the term
//     held is gone (Consul).
//
// Its fields are guarded by the SessionManager's mutex.
type Slot struct {
	name string
	id   string     // the candidate
	term *BasicTerm // set once the lease is won

	// settled is closed once the campaign won or gave the name back.
	settled chan struct{}
	isSet   bool

	// gone, set with term by wonUntilGoneLocked, is closed by Gone.
	gone chan struct{}

	// cleaning is non-nil while a clean-up marked by cleaningLocked runs,
	// and closed when it is over.
	cleaning chan struct{}
}

func (sl *Slot) settleLocked() {
	if !sl.isSet {
		sl.isSet = true
		close(sl.settled)
	}
}

// Claim claims lease name for a campaign of candidate id. While another
// campaign of the Backend claims the name (see Slot), Claim waits in line:
// claims for one name get it in the order they came. Claim fails with
// baton.ErrClosed once the Backend is closed, with an error wrapping
// baton.ErrAlreadyCampaigning while candidate id itself campaigns for or
// holds the name on this Backend, and with ctx.Err() if ctx ends first; a
// claim that fails leaves the line.
func (s *slots) Claim(ctx context.Context, name, id string) (*Slot, error) {
	s.mu.Lock()
	if s.closed() {
		s.mu.Unlock()
		return nil, baton.ErrClosed
	}
	l := s.lines[name]
	sl := s.slots[name]
	if l != nil && l.ids[id] || sl != nil && sl.id == id && (!sl.isSet || sl.term != nil && sl.term.Err() == nil) {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: lease %q, candidate %q (%s allows one campaign per lease name per candidate)",
			baton.ErrAlreadyCampaigning, name, id, s.backend)
	}
	if l == nil {
		l = &line{ids: map[string]bool{}}
		s.lines[name] = l
	}
	tk := &ticket{id: id, first: make(chan struct{})}
	l.waiting = append(l.waiting, tk)
	l.ids[id] = true
	if len(l.waiting) == 1 {
		close(tk.first)
	}
	s.mu.Unlock()
	leave := func() { // with the mutex held
		i := slices.Index(l.waiting, tk)
		l.waiting = slices.Delete(l.waiting, i, i+1)
		delete(l.ids, id)
		switch {
		case len(l.waiting) == 0:
			delete(s.lines, name)
		case i == 0:
			close(l.waiting[0].first)
		}
	}
	select {
	case <-tk.first:
	case <-ctx.Done():
		s.mu.Lock()
		leave()
		s.mu.Unlock()
		return nil, ctx.Err()
	}
	for {
		s.mu.Lock()
		if s.closed() {
			leave()
			s.mu.Unlock()
			return nil, baton.ErrClosed
		}
		var wait <-chan struct{}
		old := s.slots[name]
		switch {
		case old == nil:
		case old.cleaning != nil:
			wait = old.cleaning
		case old.term == nil:
			wait = old.settled // its campaign runs
		case old.term.Err() == nil:
			wait = old.term.Done()
		default:
			// The term ended. Its Resign may still be giving the lease
			// back, and (UntilGone) what it held may still be let go.
			if wait = old.term.releasing(); wait == nil && old.gone != nil {
				wait = old.gone
			}
		}
		if wait == nil {
			sl := &Slot{name: name, id: id, settled: make(chan struct{})}
			s.slots[name] = sl
			leave()
			s.mu.Unlock()
			return sl, nil
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			s.mu.Lock()
			leave()
			s.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// Campaign claims name for candidate id (see Claim), runs campaign with
// the slot, and gives the name back (see Unclaim) if campaign fails.
func (s *slots) Campaign(ctx context.Context, name, id string, campaign func(*Slot) (baton.Term, error)) (baton.Term, error) {
	sl, err := s.Claim(ctx, name, id)
	if err != nil {
		return nil, err
	}
	t, err := campaign(sl)
	if err != nil {
		s.Unclaim(sl)
		return nil, err
	}
	return t, nil
}

// Unclaim gives sl's name back, unless another slot took it over, a
// clean-up still needs it, or it was won with wonUntilGoneLocked (then
// Gone gives it back).
func (s *slots) Unclaim(sl *Slot) {
	s.mu.Lock()
	sl.settleLocked()
	if s.slots[sl.name] == sl && sl.cleaning == nil && sl.gone == nil {
		delete(s.slots, sl.name)
	}
	s.mu.Unlock()
}

// Claimed reports whether name is claimed.
func (s *slots) Claimed(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[name] != nil
}

// wonLocked records that sl's campaign won term t: a new claim may take
// the slot over once t ended.
func (s *slots) wonLocked(sl *Slot, t *BasicTerm) {
	sl.term = t
	sl.settleLocked()
}

// wonUntilGoneLocked records that sl's campaign won term t, and that a new
// claim waits, after t ended, until Gone(sl).
func (s *slots) wonUntilGoneLocked(sl *Slot, t *BasicTerm) {
	sl.term, sl.gone = t, make(chan struct{})
	sl.settleLocked()
}

// Gone says that what the term of sl (won with wonUntilGoneLocked) held is
// gone: it gives the name back, unless another slot took it over, and wakes
// the claims waiting for it. It is called once.
func (s *slots) Gone(sl *Slot) {
	s.mu.Lock()
	if s.slots[sl.name] == sl {
		delete(s.slots, sl.name)
	}
	s.mu.Unlock()
	close(sl.gone)
}

// cleaningLocked marks a clean-up after sl's campaign, if sl still holds
// its name and no clean-up is marked yet (ok then): until done is called,
// the name stays claimed and new claims for it wait. done ends the
// clean-up: it gives the name back, unless another slot took it over, and
// wakes the claims waiting. It is called once, without the mutex held;
// when ok is false it does nothing.
func (s *slots) cleaningLocked(sl *Slot) (done func(), ok bool) {
	if s.slots[sl.name] != sl || sl.cleaning != nil {
		return func() {}, false
	}
	cleaning := make(chan struct{})
	sl.cleaning = cleaning
	return func() {
		s.mu.Lock()
		sl.cleaning = nil
		if s.slots[sl.name] == sl {
			delete(s.slots, sl.name)
		}
		s.mu.Unlock()
		close(cleaning)
	}, true
}

// termLocked returns the term won for name, or nil.
func (s *slots) termLocked(name string) *BasicTerm {
	if sl := s.slots[name]; sl != nil {
		return sl.term
	}
	return nil
}
