package statusapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/raft"
)

// ElectorSource is one process's campaign for one lease, on any backend:
// what `baton run --http` and `baton cron --http` serve. Leases held here
// are those of its own candidate (HeldHere). On raft it reads the group's
// lease table, as an agent does, so that every member shows one lease the
// same way (raft.LeaseInfo.Member the holder's member, Waiters the queue); on
// other backends raft.LeaseInfo.Member is the holder's ID.
//
// The order of its life: NewElectorSource (before the backend is open, so
// that health answers 503 while connecting), Hooks into the
// ElectorConfig, Attach once the Elector exists, Close when done.
//
// What it answers:
//
//   - Held here: while the Elector's current term has not ended and is
//     before its safe-until (Elector.Status), without asking the backend.
//   - Otherwise it asks the backend (Backend.Leader) at each read: another
//     holder is a standby answer; a record naming this process while its
//     Elector does not lead (a term just ended here, or not yet begun) is
//     undetermined, as is every failed read.
//   - Determined is an error while the backend is not open yet, after
//     Close, and (for a raft member) while the member has no raft leader
//     it hears from, unless this process leads.
//
// Events: its own terms (elected; released or lost when they end, with the
// reason the Elector gives), its campaigns (queued, when a campaign
// starts), and the other holders it sees through Elector.WatchLeader (an
// elected event per new holder; a released event with reason "observed"
// when it sees the lease free). Safe for concurrent use.
type ElectorSource struct {
	lease, id string

	mu         sync.Mutex
	b          baton.Backend
	e          *baton.Elector
	determined func() error
	group      func() (Group, bool)
	member     RaftMember // nil unless this process is a raft member
	memberID   string     // raft.LeaseInfo.Member of this process's terms
	closed     bool
	since      time.Time // when the current term began here
	subs       map[int]func(raft.LeaseEvent)
	nextSub    int
	lastToken  uint64 // highest token of an event sent
	otherHolds string // the holder of the last event, when that was another holder's election

	evMu   sync.Mutex // serializes event delivery, in order
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var (
	_ Source      = (*ElectorSource)(nil)
	_ GroupSource = (*ElectorSource)(nil)
)

// NewElectorSource returns the source of candidate id's campaign for
// lease. Until Attach it is undetermined.
func NewElectorSource(lease, id string) *ElectorSource {
	ctx, cancel := context.WithCancel(context.Background())
	return &ElectorSource{lease: lease, id: id, memberID: id, subs: map[int]func(raft.LeaseEvent){}, ctx: ctx, cancel: cancel}
}

// Hooks sets cfg's OnElected and OnDemoted to report this process's terms,
// calling the ones cfg had after.
func (s *ElectorSource) Hooks(cfg *baton.ElectorConfig) {
	elected, demoted := cfg.OnElected, cfg.OnDemoted
	cfg.OnElected = func(t baton.Term) {
		s.elected(t)
		if elected != nil {
			elected(t)
		}
	}
	cfg.OnDemoted = func(t baton.Term, reason error) {
		s.demoted(t, reason)
		if demoted != nil {
			demoted(t, reason)
		}
	}
}

// RaftMember is what an ElectorSource reads of a raft member, when this
// process is one (raft://): raftagent.NodeSource of its *raft.Node.
type RaftMember interface {
	// ID returns the member's node ID.
	ID() string
	Determined() error
	Group() (Group, bool)
	// Lease reads the group's lease table, as an agent on the member does.
	Lease(ctx context.Context, name string) (raft.LeaseInfo, error)
}

// Attach gives the source the open backend and the Elector campaigning on
// it (made with Hooks), and member when this process is a raft member (nil
// otherwise). It starts watching who leads, which Close ends. The Elector
// is taken as campaigning from now on.
func (s *ElectorSource) Attach(b baton.Backend, e *baton.Elector, member RaftMember) {
	s.mu.Lock()
	s.b, s.e = b, e
	if member != nil {
		s.determined, s.group, s.member, s.memberID = member.Determined, member.Group, member, member.ID()
	}
	mid := s.memberID
	s.mu.Unlock()
	s.emit(raft.LeaseEvent{Lease: s.lease, Kind: raft.EventQueued, Holder: s.id, Session: s.id, Member: mid})
	s.wg.Go(func() { _ = e.WatchLeader(s.ctx, s.observe) })
}

// Close stops watching and makes the source undetermined: the process is
// stopping.
func (s *ElectorSource) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// ID returns the candidate's ID.
func (s *ElectorSource) ID() string { return s.id }

// Determined returns nil when the source can answer who holds its lease.
func (s *ElectorSource) Determined() error {
	s.mu.Lock()
	b, e, closed, det := s.b, s.e, s.closed, s.determined
	s.mu.Unlock()
	switch {
	case closed:
		return errors.New("this process is stopping")
	case b == nil || e == nil:
		return fmt.Errorf("not connected to the backend yet: %w", baton.ErrBackendUnavailable)
	case e.Status().Leader:
		return nil
	case det != nil:
		return det()
	}
	return nil
}

// Group returns the raft member's view of its group, when this process is
// a member.
func (s *ElectorSource) Group() (Group, bool) {
	s.mu.Lock()
	g := s.group
	s.mu.Unlock()
	if g == nil {
		return Group{}, false
	}
	return g()
}

// Leases returns the one lease this process campaigns for.
func (s *ElectorSource) Leases(ctx context.Context) ([]raft.LeaseInfo, error) {
	in, err := s.Lease(ctx, s.lease)
	if err != nil {
		return nil, err
	}
	return []raft.LeaseInfo{in}, nil
}

// HeldHere reports whether holder is this process's candidate.
func (s *ElectorSource) HeldHere(holder, _ string) bool { return holder != "" && holder == s.id }

// heldNow returns this process's current term of lease name ("" for its
// one lease), without asking the backend; false when it does not lead.
func (s *ElectorSource) heldNow(name string) (raft.LeaseInfo, bool) {
	if name != "" && name != s.lease {
		return raft.LeaseInfo{}, false
	}
	s.mu.Lock()
	e, since, mid, closed := s.e, s.since, s.memberID, s.closed
	s.mu.Unlock()
	if e == nil || closed {
		return raft.LeaseInfo{}, false
	}
	t := e.Status().Term
	if t == nil {
		return raft.LeaseInfo{}, false
	}
	return raft.LeaseInfo{Name: s.lease, Holder: s.id, Token: t.Token(), Since: since, SafeUntil: wall(t.SafeUntil()), Member: mid}, true
}

// Lease returns who holds lease, which must be the one this process
// campaigns for; free (no Holder) when nobody does. A raft member reads
// the group's lease table, so that it shows what an agent shows (the
// holder's member, the waiters, the group's safe-until); when that read
// fails while this process leads, it shows its own term.
func (s *ElectorSource) Lease(ctx context.Context, name string) (raft.LeaseInfo, error) {
	if name != s.lease {
		return raft.LeaseInfo{}, fmt.Errorf("this process campaigns for lease %q only: %w", s.lease, baton.ErrNoLeader)
	}
	s.mu.Lock()
	b, e, member := s.b, s.e, s.member
	s.mu.Unlock()
	if b == nil || e == nil {
		return raft.LeaseInfo{}, fmt.Errorf("not connected to the backend yet: %w", baton.ErrBackendUnavailable)
	}
	own, leading := s.heldNow(name)
	if member != nil {
		in, err := member.Lease(ctx, name)
		switch {
		case err == nil && in.Holder == s.id && !leading:
			return raft.LeaseInfo{}, fmt.Errorf("the group names this process as the holder (token %d), but it does not lead here: its term has just ended, or is just beginning", in.Token)
		case err == nil:
			return in, nil
		case leading:
			return own, nil
		case errors.Is(err, baton.ErrNoLeader):
			return raft.LeaseInfo{Name: name}, nil
		}
		return raft.LeaseInfo{}, err
	}
	if leading {
		return own, nil
	}
	rec, err := b.Leader(ctx, name)
	if errors.Is(err, baton.ErrNoLeader) {
		return raft.LeaseInfo{Name: name}, nil
	}
	if err != nil {
		return raft.LeaseInfo{}, err
	}
	if rec.Holder == s.id {
		return raft.LeaseInfo{}, fmt.Errorf("the backend names this process as the holder (token %d), but it does not lead here: its term has just ended, or is just beginning", rec.Token)
	}
	return raft.LeaseInfo{Name: name, Holder: rec.Holder, Token: rec.Token, Since: rec.Since, Member: rec.Holder}, nil
}

// wall drops t's monotonic reading, so that it prints as a wall time.
func wall(t time.Time) time.Time { return t.Round(0) }

// WatchLeases calls fn for each event of the campaign.
func (s *ElectorSource) WatchLeases(fn func(raft.LeaseEvent)) (stop func()) {
	s.mu.Lock()
	k := s.nextSub
	s.nextSub++
	s.subs[k] = fn
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.subs, k)
		s.mu.Unlock()
		// Wait for a delivery in progress.
		s.evMu.Lock()
		defer s.evMu.Unlock()
	}
}

// emit sends ev to every subscriber, in order.
func (s *ElectorSource) emit(ev raft.LeaseEvent) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	s.mu.Lock()
	fns := make([]func(raft.LeaseEvent), 0, len(s.subs))
	for _, fn := range s.subs {
		fns = append(fns, fn)
	}
	s.mu.Unlock()
	for _, fn := range fns {
		fn(ev)
	}
}

func (s *ElectorSource) elected(t baton.Term) {
	s.mu.Lock()
	s.since = time.Now()
	s.lastToken = max(s.lastToken, t.Token())
	s.otherHolds = ""
	mid := s.memberID
	s.mu.Unlock()
	s.emit(raft.LeaseEvent{Lease: s.lease, Kind: raft.EventElected, Holder: s.id, Session: s.id, Member: mid, Token: t.Token()})
}

func (s *ElectorSource) demoted(t baton.Term, reason error) {
	kind, why := raft.EventReleased, "resigned"
	switch {
	case errors.Is(reason, baton.ErrLeaseLost):
		kind, why = raft.EventLost, "lease-lost"
	case errors.Is(reason, baton.ErrExpired):
		kind, why = raft.EventLost, "expired"
	case errors.Is(reason, baton.ErrClosed):
		why = "closed"
	case errors.Is(reason, baton.ErrStoppedEarly):
		why = "stopped-early"
	}
	s.mu.Lock()
	mid := s.memberID
	s.mu.Unlock()
	s.emit(raft.LeaseEvent{Lease: s.lease, Kind: kind, Holder: s.id, Session: s.id, Member: mid, Token: t.Token(), Reason: why})
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if !closed && s.ctx.Err() == nil {
		// The Elector campaigns again, unless its process stops.
		s.emit(raft.LeaseEvent{Lease: s.lease, Kind: raft.EventQueued, Holder: s.id, Session: s.id, Member: mid})
	}
}

// observe takes an answer of Elector.WatchLeader: another holder's term
// begins, or the lease is free. This process's own terms come from the
// Elector's hooks, never from here.
func (s *ElectorSource) observe(rec baton.Record, err error) {
	s.mu.Lock()
	var ev *raft.LeaseEvent
	switch {
	case errors.Is(err, baton.ErrNoLeader):
		if s.otherHolds != "" {
			ev = &raft.LeaseEvent{Lease: s.lease, Kind: raft.EventReleased, Holder: s.otherHolds, Member: s.otherHolds, Token: s.lastToken, Reason: "observed"}
			s.otherHolds = ""
		}
	case err != nil, rec.Holder == s.id, rec.Token <= s.lastToken:
	default:
		s.lastToken, s.otherHolds = rec.Token, rec.Holder
		ev = &raft.LeaseEvent{Lease: s.lease, Kind: raft.EventElected, Holder: rec.Holder, Member: rec.Holder, Token: rec.Token}
	}
	s.mu.Unlock()
	if ev != nil {
		s.emit(*ev)
	}
}
