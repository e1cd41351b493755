package raft

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	hraft "github.com/hashicorp/raft"
)

// The replicated state: sessions (one per Backend, kept alive by renewals
// that the raft leader times) and leases (a holder and a FIFO queue of
// waiting sessions). Everything that is not a pure function of the log (the
// wall-clock time of a grant, say) travels in the command.

// op names a command.
type op string

const (
	opSessionCreate  op = "session-create"
	opSessionDestroy op = "session-destroy" // a Backend closing
	opSessionExpire  op = "session-expire"  // the raft leader's timer ran out
	opAcquire        op = "acquire"         // hold the lease if free, else queue up
	opRelease        op = "release"         // give the lease up (Resign)
	opDequeue        op = "dequeue"         // stop waiting (a cancelled Campaign)
	opNoop           op = "noop"            // carries the commit index to followers at once
	opRequestResign  op = "request-resign"  // ask the holder to resign (Node.RequestResign)
	opStateStore     op = "state-store"     // replace the lease's state, if the term still holds it
	opRecover        op = "recover"         // a group re-formed from a lost majority: new epoch, no sessions (recover.go)
	opHoldOver       op = "hold-over"       // the hold after a recovery passed: grants may resume
)

// command is one log entry's payload.
type command struct {
	Op        op            `json:"op"`
	Session   string        `json:"session,omitempty"`
	Node      string        `json:"node,omitempty"`
	TTL       time.Duration `json:"ttl,omitempty"`
	Lease     string        `json:"lease,omitempty"`
	Candidate string        `json:"candidate,omitempty"`
	// Token is the term's token (release, state-store); on an acquire, the
	// highest token the campaigner held for the lease before, which the
	// log does not use: members compare it with the token granted (see
	// checkTokenAboveHeld).
	Token uint64 `json:"token,omitempty"`
	// Time is the proposer's wall clock, recorded as a term's Since; the
	// group's first acquire sets the group's epoch from it.
	Time time.Time `json:"time,omitzero"`
	// Reason qualifies a session-destroy: reasonExpired when the Backend
	// gave the session up because its own safe-until passed (a loss, not a
	// Close).
	Reason string `json:"reason,omitempty"`
	// Value is a state-store's new state.
	Value []byte `json:"value,omitempty"`
	// Agent marks a session-create of an agent client, made through the
	// member Node names.
	Agent bool `json:"agent,omitempty"`
	// Hold is, on a recover, how long no lease may be granted after it:
	// the longest TTL the group grants (NodeOptions.MaxTTL) and a margin.
	Hold time.Duration `json:"hold,omitempty"`
	// Auth is, in an agent client's session-create, the SHA-256 digest of
	// the session's secret (never the secret itself).
	Auth []byte `json:"auth,omitempty"`
}

// result is what applying a command returns to its proposer.
type result struct {
	Index  uint64 `json:"index"`
	Holder bool   `json:"holder,omitempty"` // acquire: the session holds the lease now
	Token  uint64 `json:"token,omitempty"`  // acquire: its token when Holder
	// Again reports, for an acquire, that the session held the lease
	// already: a retried acquire, or a term whose release did not land.
	Again bool   `json:"again,omitempty"`
	Err   string `json:"err,omitempty"` // the command was refused (an unknown session, say)
	// Promoted reports that the command handed a lease to a waiter.
	Promoted bool `json:"promoted,omitempty"`
	// Lost reports that a state-store was refused because its term no
	// longer holds the lease in the log.
	Lost bool `json:"lost,omitempty"`
	// Prev is, for an acquire that got the lease, the term before it,
	// when this copy of the log knows it.
	Prev *prevTerm `json:"prev,omitempty"`
}

// sessionRec is a session as the log knows it.
type sessionRec struct {
	ID   string        `json:"id"`
	Node string        `json:"node"`
	TTL  time.Duration `json:"ttl"`
	// Agent marks an agent client's session: Node is the member it was
	// made through, not the process that holds its leases.
	Agent bool `json:"agent,omitempty"`
	// Auth is the SHA-256 digest of an agent client's session secret: the
	// raft leader acts on the client's behalf only for a caller that
	// presents the secret (Node.ClientHandler).
	Auth []byte `json:"auth,omitempty"`

	// candidate is the candidate ID of the session's last acquire, so
	// that the leases of a session whose candidates share an ID share one
	// copy of it. Not in snapshots.
	candidate string
}

// candidateID returns id, sharing the copy s kept if it is the same.
func (s *sessionRec) candidateID(id string) string {
	if id != s.candidate {
		s.candidate = id
	}
	return s.candidate
}

// waiter is a session queued for a lease.
type waiter struct {
	Session   string `json:"session"`
	Candidate string `json:"candidate"`
}

// leaseRec is a lease as the log knows it. A lease with no holder and no
// waiters is deleted.
type leaseRec struct {
	Name      string    `json:"name"`
	Session   string    `json:"session,omitempty"` // the holder's session; empty when free
	Candidate string    `json:"candidate,omitempty"`
	Token     uint64    `json:"token,omitempty"`
	Since     time.Time `json:"since,omitzero"`
	Queue     []waiter  `json:"queue,omitempty"`
	// ResignRequested is set by a request-resign and cleared when the
	// lease changes hands: the holder's renewals carry it until it
	// releases.
	ResignRequested bool `json:"resign_requested,omitempty"`
}

// stateRec is a lease's state (baton.StateTerm). It outlives the lease
// record, which goes when nobody holds or waits for the lease.
type stateRec struct {
	Value []byte `json:"value"`
	Token uint64 `json:"token"` // the term that stored it
	Index uint64 `json:"index"` // the entry that stored it
}

// state is the whole replicated state; it is also the snapshot format.
type state struct {
	Index uint64 `json:"index"`
	// Epoch is the group's epoch (backend.EpochOf): the wall-clock
	// second, on the proposing member, of the first acquire in the log.
	// Tokens are Epoch<<32 + the index of the granting entry, so that a
	// group created after another one died (a whole in-memory group
	// restarted) gives higher tokens though its log starts again at 1.
	// Zero until the first acquire.
	Epoch    uint64                 `json:"epoch,omitempty"`
	Sessions map[string]*sessionRec `json:"sessions"`
	Leases   map[string]*leaseRec   `json:"leases"`
	States   map[string]*stateRec   `json:"states,omitempty"`
	// Recovery is the last recovery from a lost majority (recover.go),
	// nil if the group never had one.
	Recovery *recoveryRec `json:"recovery,omitempty"`
}

// recoveryRec is a recovery of the group from a lost majority, as the log
// records it.
type recoveryRec struct {
	Index    uint64        `json:"index"`              // the recover entry
	Time     time.Time     `json:"time"`               // the proposer's wall clock
	Hold     time.Duration `json:"hold"`               // no grant for this long after it
	OldEpoch uint64        `json:"old_epoch,omitzero"` // the epoch before it
	HoldOver bool          `json:"hold_over,omitempty"`
}

// fsm applies commands to the state and tells local watchers about changes.
// It is safe for concurrent use.
type fsm struct {
	mu    sync.Mutex
	st    state
	bySes map[string]map[string]struct{} // session -> lease names it holds or waits for
	// asked is session -> the names of the leases it holds whose resign
	// was requested (a superset: resigns checks each), so that a renewal's
	// look-up of its orders does not walk every lease the session holds.
	asked map[string]map[string]struct{}
	// watch has one channel per watched lease name, closed (and dropped)
	// when that lease changes; any is closed on every change.
	watch map[string]chan struct{}
	any   chan struct{}
	// mod is the index of each lease's last change, kept after the lease
	// is deleted so that a blocking read can tell that it changed.
	mod map[string]uint64
	// promoted is set by free, during one Apply, when a waiter got a lease.
	promoted bool
	// events collects one Apply's lease events; watchers get them at its
	// end.
	events   []LeaseEvent
	watchers map[*leaseWatcher]struct{}
	// onEpoch, if set, is called with the group's epoch when this copy of
	// the log learns it: from the acquire that sets it, or from a
	// snapshot. It is called with mu held.
	onEpoch func(e uint64)
	// lastEnd is the last term of each lease to end, and pred the term
	// before each lease's current one, as this copy of the log applied
	// them. Not in snapshots: after a restore, what came before is
	// unknown (restored), not "none". A lease's first term has no entry
	// in pred (prevOf tells it from having no lastEnd), so that a table
	// of leases held once costs nothing here.
	lastEnd  map[string]prevTerm
	pred     map[string]prevTerm // keyed by lease; Next is the current term's token
	restored bool
}

// prevTerm is the term of a lease before another: what the "elected" line
// of the next holder names (baton.Predecessor).
type prevTerm struct {
	First  bool   `json:"first,omitempty"` // the lease had no term before, in the whole log
	Holder string `json:"holder,omitempty"`
	Member string `json:"member,omitempty"`
	Token  uint64 `json:"token,omitempty"`
	Reason string `json:"reason,omitempty"` // a LeaseEvent reason
	// Next is the token of the term this one preceded.
	Next uint64 `json:"next"`
}

// predecessorOf returns p in the baton's words.
func (p prevTerm) predecessor() baton.Predecessor {
	if p.First {
		return baton.Predecessor{First: true}
	}
	ended := p.Reason
	switch p.Reason {
	case reasonResigned:
		ended = "resigned"
	case reasonResignRequested:
		ended = "resigned on request"
	case reasonClosed:
		ended = "released as its process stopped"
	case reasonExpired:
		ended = "expired: not renewed within the TTL (the holder or its member was lost)"
	}
	return baton.Predecessor{Holder: p.Holder, Via: p.Member, Token: p.Token, Ended: ended}
}

func newFSM() *fsm {
	f := &fsm{watch: map[string]chan struct{}{}, any: make(chan struct{}), mod: map[string]uint64{},
		watchers: map[*leaseWatcher]struct{}{}}
	f.reset(state{})
	return f
}

func (f *fsm) reset(st state) {
	if st.Sessions == nil {
		st.Sessions = map[string]*sessionRec{}
	}
	if st.Leases == nil {
		st.Leases = map[string]*leaseRec{}
	}
	if st.States == nil {
		st.States = map[string]*stateRec{}
	}
	f.st = st
	f.bySes = map[string]map[string]struct{}{}
	f.asked = map[string]map[string]struct{}{}
	f.lastEnd, f.pred = map[string]prevTerm{}, map[string]prevTerm{}
	for _, l := range st.Leases {
		if l.Session != "" {
			f.link(l.Session, l.Name)
		}
		if l.Session != "" && l.ResignRequested {
			f.ask(l.Session, l.Name)
		}
		for _, w := range l.Queue {
			f.link(w.Session, l.Name)
		}
	}
}

func (f *fsm) link(session, lease string) {
	m := f.bySes[session]
	if m == nil {
		m = map[string]struct{}{}
		f.bySes[session] = m
	}
	m[lease] = struct{}{}
}

// ask notes that session was asked to resign lease.
func (f *fsm) ask(session, lease string) {
	m := f.asked[session]
	if m == nil {
		m = map[string]struct{}{}
		f.asked[session] = m
	}
	m[lease] = struct{}{}
}

func (f *fsm) unlink(session, lease string) {
	if m := f.bySes[session]; m != nil {
		delete(m, lease)
		if len(m) == 0 {
			delete(f.bySes, session)
		}
	}
}

// changed wakes the watchers of lease ("" for none in particular).
func (f *fsm) changed(lease string) {
	f.mod[lease] = f.st.Index
	if ch, ok := f.watch[lease]; ok {
		close(ch)
		delete(f.watch, lease)
	}
}

// Apply implements hraft.FSM.
func (f *fsm) Apply(l *hraft.Log) any {
	if l.Type != hraft.LogCommand {
		return nil
	}
	var c command
	if err := json.Unmarshal(l.Data, &c); err != nil {
		// Every node refuses the same bytes the same way, so the state
		// stays identical everywhere.
		return &result{Index: l.Index, Err: fmt.Sprintf("undecodable command: %v", err)}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Index = l.Index
	f.promoted = false
	f.events = f.events[:0]
	r := f.apply(l.Index, &c)
	r.Index = l.Index
	r.Promoted = f.promoted
	if len(f.events) > 0 {
		for w := range f.watchers {
			w.push(f.events)
		}
	}
	close(f.any)
	f.any = make(chan struct{})
	return r
}

// apply applies one command; Apply holds f.mu.
func (f *fsm) apply(index uint64, c *command) *result {
	switch c.Op {
	case opSessionCreate:
		return f.sessionCreate(c)
	case opSessionDestroy, opSessionExpire:
		return f.sessionEnd(index, c)
	case opAcquire:
		return f.acquire(index, c)
	case opRelease:
		return f.release(index, c)
	case opDequeue:
		return f.leaveQueue(c)
	case opRequestResign:
		return f.requestResign(c)
	case opStateStore:
		return f.stateStore(index, c)
	case opRecover:
		return f.recover(index, c)
	case opHoldOver:
		if f.st.Recovery != nil {
			f.st.Recovery.HoldOver = true
		}
		return &result{}
	case opNoop:
		return &result{}
	}
	return &result{Err: fmt.Sprintf("unknown operation %q", c.Op)}
}

// sessionCreate adds a session.
func (f *fsm) sessionCreate(c *command) *result {
	if s, ok := f.st.Sessions[c.Session]; ok {
		// A retried create whose first reply was lost is a no-op; one
		// with another secret is someone else's.
		if s.Agent != c.Agent || !bytes.Equal(s.Auth, c.Auth) {
			return &result{Err: errSessionExists}
		}
		return &result{}
	}
	f.st.Sessions[c.Session] = &sessionRec{ID: c.Session, Node: c.Node, TTL: c.TTL, Agent: c.Agent, Auth: c.Auth}
	return &result{}
}

// sessionEnd removes a session (a destroy or an expiry): its leases go to
// their first waiters, and its queue places go.
func (f *fsm) sessionEnd(index uint64, c *command) *result {
	s, ok := f.st.Sessions[c.Session]
	if !ok {
		return &result{}
	}
	kind, reason := EventReleased, reasonClosed
	if c.Op == opSessionExpire || c.Reason == reasonExpired {
		kind, reason = EventLost, reasonExpired
	}
	delete(f.st.Sessions, c.Session)
	for _, name := range slices.Sorted(maps.Keys(f.bySes[c.Session])) {
		l := f.st.Leases[name]
		if l.Session == c.Session {
			f.emit(LeaseEvent{Lease: name, Kind: kind, Holder: l.Candidate, Session: l.Session,
				Member: s.Node, Token: l.Token, At: c.Time, Reason: reason})
			f.free(index, l, c.Time)
		} else {
			f.dequeue(l, c.Session, s.Node, c.Time, reason)
		}
	}
	delete(f.bySes, c.Session)
	return &result{}
}

// acquire gives the lease to the session if it is free, else queues the
// session up (once).
func (f *fsm) acquire(index uint64, c *command) *result {
	s, ok := f.st.Sessions[c.Session]
	if !ok {
		return &result{Err: errUnknownSession}
	}
	if f.st.Epoch == 0 {
		if c.Time.IsZero() {
			return &result{Err: errNoEpoch}
		}
		f.st.Epoch = backend.EpochOf(c.Time)
		if f.onEpoch != nil {
			f.onEpoch(f.st.Epoch)
		}
	}
	l := f.st.Leases[c.Lease]
	if l == nil {
		l = &leaseRec{Name: c.Lease}
		f.st.Leases[c.Lease] = l
	}
	cand := s.candidateID(c.Candidate)
	switch {
	case l.Session == c.Session:
		// A retried acquire whose first reply was lost.
		return &result{Holder: true, Again: true, Token: l.Token, Prev: f.prevOf(c.Lease, l.Token)}
	case l.Session == "":
		tok := f.token(index)
		// s.ID, not c.Session: one copy of the session's ID for all its
		// leases, not one per command.
		l.Session, l.Candidate, l.Token, l.Since = s.ID, cand, tok, c.Time
		l.ResignRequested = false
		f.link(s.ID, c.Lease)
		f.emit(LeaseEvent{Lease: c.Lease, Kind: EventElected, Holder: c.Candidate, Session: c.Session,
			Member: s.Node, Token: tok, At: c.Time})
		f.changed(c.Lease)
		return &result{Holder: true, Token: tok, Prev: f.prevOf(c.Lease, tok)}
	}
	if !slices.ContainsFunc(l.Queue, func(w waiter) bool { return w.Session == c.Session }) {
		l.Queue = append(l.Queue, waiter{Session: s.ID, Candidate: cand})
		f.link(s.ID, c.Lease)
		f.emit(LeaseEvent{Lease: c.Lease, Kind: EventQueued, Holder: c.Candidate, Session: c.Session,
			Member: s.Node, At: c.Time})
		f.changed(c.Lease)
	}
	return &result{}
}

// release ends the term the command names, if it still holds the lease.
func (f *fsm) release(index uint64, c *command) *result {
	l := f.st.Leases[c.Lease]
	if l != nil && l.Session == c.Session && l.Token == c.Token {
		reason := reasonResigned
		if l.ResignRequested {
			reason = reasonResignRequested
		}
		f.emit(LeaseEvent{Lease: c.Lease, Kind: EventReleased, Holder: l.Candidate, Session: l.Session,
			Member: f.memberOf(l.Session), Token: l.Token, At: c.Time, Reason: reason})
		f.free(index, l, c.Time)
	}
	return &result{}
}

// leaveQueue takes the session out of the lease's queue (a candidate that
// gave up).
func (f *fsm) leaveQueue(c *command) *result {
	if l := f.st.Leases[c.Lease]; l != nil {
		f.dequeue(l, c.Session, f.memberOf(c.Session), c.Time, "")
	}
	return &result{}
}

// requestResign marks the lease's holder as asked to resign.
func (f *fsm) requestResign(c *command) *result {
	l := f.st.Leases[c.Lease]
	if l == nil || l.Session == "" {
		return &result{Err: errNoHolder}
	}
	if !l.ResignRequested {
		l.ResignRequested = true
		f.ask(l.Session, c.Lease)
		f.changed(c.Lease)
	}
	return &result{Holder: true, Token: l.Token}
}

// stateStore replaces the lease's state, if the command's term still
// holds the lease.
func (f *fsm) stateStore(index uint64, c *command) *result {
	if len(c.Value) > baton.MaxStateSize {
		// StoreState checks first; this keeps a client that did not
		// from growing the state.
		return &result{Err: fmt.Sprintf("state of %d bytes, at most %d", len(c.Value), baton.MaxStateSize)}
	}
	l := f.st.Leases[c.Lease]
	if l == nil || l.Session == "" || l.Session != c.Session || l.Token != c.Token {
		return &result{Lost: true}
	}
	v := slices.Clone(c.Value)
	if v == nil {
		v = []byte{}
	}
	f.st.States[c.Lease] = &stateRec{Value: v, Token: c.Token, Index: index}
	return &result{Holder: true, Token: l.Token}
}

// recover starts the group's life after a recovery from a lost majority.
// The lost members may have committed entries that this log lacks (grants
// among them), so the group takes an epoch above the old one and above
// the proposer's clock: every token it grants from here is above any
// token of the old epoch, whatever the index. Sessions and leases go: a
// holder the log shows may have lost its lease in entries this log lacks,
// and a holder it does not show may hold one; every holder's safe-until
// has passed by the end of the hold, and sessions start again.
func (f *fsm) recover(index uint64, c *command) *result {
	old := f.st.Epoch
	f.st.Epoch = max(old, backend.EpochOf(c.Time)) + 1
	for _, name := range slices.Sorted(maps.Keys(f.st.Leases)) {
		l := f.st.Leases[name]
		if l.Session != "" {
			f.emit(LeaseEvent{Lease: name, Kind: EventLost, Holder: l.Candidate, Session: l.Session,
				Member: f.memberOf(l.Session), Token: l.Token, At: c.Time, Reason: reasonRecovered})
		}
		f.changed(name)
	}
	f.st.Leases = map[string]*leaseRec{}
	f.st.Sessions = map[string]*sessionRec{}
	f.bySes = map[string]map[string]struct{}{}
	f.asked = map[string]map[string]struct{}{}
	f.st.Recovery = &recoveryRec{Index: index, Time: c.Time, Hold: c.Hold, OldEpoch: old}
	if f.onEpoch != nil {
		f.onEpoch(f.st.Epoch)
	}
	return &result{}
}

// recovery returns the last recovery, if any.
func (f *fsm) recovery() (recoveryRec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st.Recovery == nil {
		return recoveryRec{}, false
	}
	return *f.st.Recovery, true
}

// errUnknownSession is the refusal of a command naming a session the log no
// longer has: it expired or was destroyed.
const errUnknownSession = "unknown session"

// errSessionExists is the refusal of a session-create naming a session the
// log has with another secret.
const errSessionExists = "a session with this ID exists"

// errNoEpoch is the refusal of an acquire that would set the group's epoch
// but carries no time.
const errNoEpoch = "the group has no epoch yet and the acquire carries no time to set it from"

// token is the fencing token of a grant by the entry at index.
func (f *fsm) token(index uint64) uint64 { return backend.EpochToken(f.st.Epoch, index) }

// errNoHolder is the refusal of a request-resign for a lease nobody holds.
const errNoHolder = "nobody holds the lease"

// The reasons of LeaseEvents.
const (
	reasonResigned        = "resigned"
	reasonResignRequested = "resign-requested"
	reasonExpired         = "session-expired"
	reasonClosed          = "session-closed"
	reasonRecovered       = "group-recovered" // the group re-formed from a lost majority
)

// emit records ev for the watchers, at the end of this Apply, and the
// lease's predecessors.
func (f *fsm) emit(ev LeaseEvent) {
	switch ev.Kind {
	case EventReleased, EventLost:
		f.lastEnd[ev.Lease] = prevTerm{Holder: ev.Holder, Member: ev.Member, Token: ev.Token, Reason: ev.Reason}
	case EventElected:
		p, ok := f.lastEnd[ev.Lease]
		switch {
		case ok:
			p.Next = ev.Token
			f.pred[ev.Lease] = p
		default:
			// The first term (prevOf), or unknown after a restore.
			delete(f.pred, ev.Lease)
		}
	}
	f.events = append(f.events, ev)
}

// prevOf returns the term before lease's term with token, if known.
func (f *fsm) prevOf(lease string, token uint64) *prevTerm {
	if p, ok := f.pred[lease]; ok {
		if p.Next == token {
			return &p
		}
		return nil
	}
	if _, ended := f.lastEnd[lease]; ended || f.restored {
		return nil
	}
	// No term of lease ended in the whole log: the current one, if it
	// is token's, is the first.
	if l := f.st.Leases[lease]; l != nil && l.Session != "" && l.Token == token {
		return &prevTerm{First: true, Next: token}
	}
	return nil
}

// memberOf returns the node ID session was created through ("" when the
// log has no such session).
func (f *fsm) memberOf(session string) string {
	if s := f.st.Sessions[session]; s != nil {
		return s.Node
	}
	return ""
}

// free ends l's term and hands l to the first waiter, whose token is
// made from this entry's index.
func (f *fsm) free(index uint64, l *leaseRec, at time.Time) {
	f.unlink(l.Session, l.Name)
	if m := f.asked[l.Session]; m != nil {
		delete(m, l.Name)
		if len(m) == 0 {
			delete(f.asked, l.Session)
		}
	}
	l.Session, l.Candidate, l.Token, l.Since = "", "", 0, time.Time{}
	l.ResignRequested = false
	if len(l.Queue) > 0 {
		w := l.Queue[0]
		l.Queue = slices.Delete(l.Queue, 0, 1)
		tok := f.token(index)
		l.Session, l.Candidate, l.Token, l.Since = w.Session, w.Candidate, tok, at
		f.promoted = true
		f.emit(LeaseEvent{Lease: l.Name, Kind: EventElected, Holder: w.Candidate, Session: w.Session,
			Member: f.memberOf(w.Session), Token: tok, At: at})
	}
	if l.Session == "" && len(l.Queue) == 0 {
		delete(f.st.Leases, l.Name)
	}
	f.changed(l.Name)
}

// dequeue takes session out of l's queue; member, at and reason describe
// it in the event.
func (f *fsm) dequeue(l *leaseRec, session, member string, at time.Time, reason string) {
	i := slices.IndexFunc(l.Queue, func(w waiter) bool { return w.Session == session })
	if i < 0 {
		return
	}
	w := l.Queue[i]
	l.Queue = slices.Delete(l.Queue, i, i+1)
	f.unlink(session, l.Name)
	f.emit(LeaseEvent{Lease: l.Name, Kind: EventDequeued, Holder: w.Candidate, Session: session,
		Member: member, At: at, Reason: reason})
	if l.Session == "" && len(l.Queue) == 0 {
		delete(f.st.Leases, l.Name)
	}
	f.changed(l.Name)
}

// epoch returns the group's epoch (0 before the first acquire).
func (f *fsm) epoch() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.Epoch
}
