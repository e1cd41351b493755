package raft

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	hraft "github.com/hashicorp/raft"
)

// The read side of the FSM: copies of its state for the Backend, the
// agent's table and snapshots.

// leaseView is a copy of a lease's state at some applied index.
type leaseView struct {
	Index     uint64    `json:"index"`    // the FSM's applied index when read
	Modified  uint64    `json:"modified"` // the index of the lease's last change (0: none seen)
	Name      string    `json:"name"`
	Session   string    `json:"session,omitempty"`
	Candidate string    `json:"candidate,omitempty"`
	Token     uint64    `json:"token,omitempty"`
	Since     time.Time `json:"since,omitzero"`
	// Waiting reports whether the session asked about is queued.
	Waiting bool `json:"waiting,omitempty"`
	// SessionGone reports that the session asked about is not in the log.
	SessionGone bool `json:"session_gone,omitempty"`
	// Prev is the term before the holder's, when the copy of the log read
	// knows it.
	Prev *prevTerm `json:"prev,omitempty"`
}

// lease returns name's state as seen by session (which may be ""), and a
// channel closed at its next change.
func (f *fsm) lease(name, session string) (leaseView, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := leaseView{Index: f.st.Index, Name: name, Modified: f.mod[name]}
	if l := f.st.Leases[name]; l != nil {
		v.Session, v.Candidate, v.Token, v.Since = l.Session, l.Candidate, l.Token, l.Since
		if l.Session != "" {
			v.Prev = f.prevOf(name, l.Token)
		}
		v.Waiting = session != "" && slices.ContainsFunc(l.Queue, func(w waiter) bool { return w.Session == session })
	}
	if session != "" {
		_, ok := f.st.Sessions[session]
		v.SessionGone = !ok
	}
	ch, ok := f.watch[name]
	if !ok {
		ch = make(chan struct{})
		f.watch[name] = ch
	}
	return v, ch
}

// holder returns the applied index and the session and token holding
// name ("" and 0 when free). Unlike lease, it leaves no channel behind.
func (f *fsm) holder(name string) (index uint64, session string, token uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.st.Leases[name]; l != nil {
		return f.st.Index, l.Session, l.Token
	}
	return f.st.Index, "", 0
}

// applied returns the last applied index and a channel closed at the next
// apply.
func (f *fsm) applied() (uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.Index, f.any
}

// sessions returns a copy of the sessions in the log.
func (f *fsm) sessions() map[string]sessionRec {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]sessionRec, len(f.st.Sessions))
	for id, s := range f.st.Sessions {
		out[id] = *s
	}
	return out
}

// session returns the session id, as the log has it.
func (f *fsm) session(id string) (sessionRec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.st.Sessions[id]
	if !ok {
		return sessionRec{}, false
	}
	return *s, true
}

// holdingMembers returns the members whose own sessions (not their agent
// clients') hold at least one lease.
func (f *fsm) holdingMembers() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Every member asks once per heartbeat timeout: walk the sessions, and
	// each session's leases only until one it holds, so that a process
	// holding thousands of leases costs one look-up, not thousands.
	out := map[string]bool{}
	for id, s := range f.st.Sessions {
		if s.Agent || out[s.Node] {
			continue
		}
		for name := range f.bySes[id] {
			if l := f.st.Leases[name]; l != nil && l.Session == id {
				out[s.Node] = true
				break
			}
		}
	}
	return out
}

// leaseRow is a lease of the table, with its holder's session (for the
// raft leader's session timers).
type leaseRow struct {
	LeaseInfo
	session string
}

// table returns the leases, sorted by name; only name's when name is not
// empty.
func (f *fsm) table(name string) []leaseRow {
	f.mu.Lock()
	defer f.mu.Unlock()
	var rows []leaseRow
	add := func(l *leaseRec) {
		rows = append(rows, leaseRow{session: l.Session, LeaseInfo: LeaseInfo{
			Name: l.Name, Holder: l.Candidate, Token: l.Token, Since: l.Since,
			Member: f.memberOf(l.Session), Waiters: len(l.Queue), ResignRequested: l.ResignRequested,
		}})
	}
	if name != "" {
		if l := f.st.Leases[name]; l != nil {
			add(l)
		}
		return rows
	}
	for _, n := range slices.Sorted(maps.Keys(f.st.Leases)) {
		add(f.st.Leases[n])
	}
	return rows
}

// resigns returns the leases session holds whose resign was requested.
func (f *fsm) resigns(session string) []resignOrder {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Asked on every renewal: look only at the leases whose resign was
	// requested (usually none), not at every lease the session holds.
	var out []resignOrder
	for name := range f.asked[session] {
		if l := f.st.Leases[name]; l != nil && l.Session == session && l.ResignRequested {
			out = append(out, resignOrder{Lease: name, Token: l.Token})
		}
	}
	slices.SortFunc(out, func(a, b resignOrder) int { return strings.Compare(a.Lease, b.Lease) })
	return out
}

// stateView is a lease's state as read at some applied index.
type stateView struct {
	Index  uint64 `json:"index"`
	Stored bool   `json:"stored,omitempty"` // some term stored a value
	Value  []byte `json:"value,omitempty"`
	Token  uint64 `json:"token,omitempty"` // the term that stored it
}

// state returns name's state.
func (f *fsm) state(name string) stateView {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := stateView{Index: f.st.Index}
	if s := f.st.States[name]; s != nil {
		v.Stored, v.Value, v.Token = true, slices.Clone(s.Value), s.Token
	}
	return v
}

// Snapshot implements hraft.FSM.
func (f *fsm) Snapshot() (hraft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := json.Marshal(&f.st)
	if err != nil {
		return nil, err
	}
	return snapshot(b), nil
}

// Restore implements hraft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var st state
	if err := json.NewDecoder(rc).Decode(&st); err != nil {
		return fmt.Errorf("raft: restore snapshot: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reset(st)
	f.restored = true
	if st.Epoch != 0 && f.onEpoch != nil {
		f.onEpoch(st.Epoch)
	}
	for name, ch := range f.watch {
		close(ch)
		delete(f.watch, name)
	}
	for name := range f.mod {
		f.mod[name] = st.Index
	}
	for name := range st.Leases {
		f.mod[name] = st.Index
	}
	for w := range f.watchers {
		if w.restores {
			w.push([]LeaseEvent{{Kind: eventRestored}})
		}
	}
	close(f.any)
	f.any = make(chan struct{})
	return nil
}

type snapshot []byte

func (s snapshot) Persist(sink hraft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s snapshot) Release() {}
