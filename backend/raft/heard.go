package raft

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	hraft "github.com/hashicorp/raft"
)

// A new raft leader times every session from a base: the latest moment at
// which the group's earlier raft leaders could still have confirmed a
// renewal. It is found from what the voters heard, as follows.
//
// A renewal counts (its sender's safe-until moves) only once the raft
// leader of some term T has confirmed with a quorum Q of voters that it
// still leads (VerifyLeader), after the renewal reached it. Each voter in Q
// acknowledged an RPC of term T to do so. A voter that has moved to a later
// term refuses every RPC of T from then on. The new leader, of term N, asks
// the voters when they last received an RPC (or led) in a term below N, and
// waits for the answers of a quorum R of voters that are in term N or later.
// Q and R share a voter, v. v received the confirming RPC, which the old
// leader sent after the renewal reached it, before v moved past T, so
// before it answered: the last receipt v reports is no earlier. Every
// renewal that any earlier leader confirmed was therefore sent no later
// than the latest receipt R reports, and its sender's
// safe-until is at most that moment plus its TTL (minus the drift margin).
// The base is that moment; a session gets its TTL from there, and so never
// expires before a safe-until that an earlier leader confirmed.
//
// One more step is needed because hashicorp/raft's VerifyLeader counts the
// reply to an RPC that was already on its way when the renewal arrived:
// the voter may have received it a little before the renewal was sent.
// Two things bound that "little". The raft leader counts no reply to an
// AppendEntries (heartbeats included) that came back more than half a
// heartbeat timeout after it began the call (heardTransport.AppendEntries),
// and the base carries that half heartbeat timeout as a margin; and a raft
// leader that stood still (a GC pause, a stopped or starved process)
// between reading a reply and counting it confirms no renewal until it has
// run for a while again (stallWatch).
//
// Assumptions, beside raft's: two quorums of the configuration share a
// voter (raft changes the configuration one server at a time); a member
// that restarted may have acknowledged anything before it started, so its
// start counts as a receipt; and the reply to an InstallSnapshot (sent to
// a voter that fell too far behind for AppendEntries), which may take long
// to send, reaches the raft leader within half a heartbeat timeout plus
// the drift margin of the voter's last receipt, or not at all. Without a
// quorum's answers within a heartbeat timeout (at least a second), the base
// is the new leader's own start: every session gets a full TTL from there.

// heardLog records when this member last received a raft RPC of each term,
// or last led in one.
type heardLog struct {
	mu sync.Mutex
	// older is the latest receipt of the terms pruned from last, and at
	// least this member's start.
	older time.Time
	last  map[uint64]time.Time // term -> last receipt of an AppendEntries or InstallSnapshot
	// leading is the term this member leads in (per stepUp), 0 when none.
	leading uint64
}

func newHeardLog() *heardLog {
	return &heardLog{older: time.Now(), last: map[uint64]time.Time{}}
}

// saw records the receipt of an RPC of term, now.
func (h *heardLog) saw(term uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sawLocked(term, time.Now())
}

func (h *heardLog) sawLocked(term uint64, at time.Time) {
	if at.After(h.last[term]) {
		h.last[term] = at
	}
	if len(h.last) > 8 {
		t := slices.Min(slices.Collect(maps.Keys(h.last)))
		if h.last[t].After(h.older) {
			h.older = h.last[t]
		}
		delete(h.last, t)
	}
}

// lead records that this member leads in term from now on; 0 that it
// stopped leading, now.
func (h *heardLog) lead(term uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leading != 0 {
		h.sawLocked(h.leading, time.Now())
	}
	h.leading = term
}

// before returns the latest moment at which this member received an RPC
// of a term below term, or led in one: now, while it leads in a term
// other than the one it asks for itself (self). The term recorded by lead
// is raft's when stepUp ran, which may already be past the one it was
// elected in; so, asked by another member, a leading member always says
// now.
func (h *heardLog) before(term uint64, self bool) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leading != 0 && !(self && h.leading == term) {
		return time.Now()
	}
	at := h.older
	for t, d := range h.last {
		if t < term && d.After(at) {
			at = d
		}
	}
	return at
}

// note records rpc's term when it is an RPC that only a leader sends.
func (h *heardLog) note(rpc hraft.RPC) {
	switch c := rpc.Command.(type) {
	case *hraft.AppendEntriesRequest:
		h.saw(c.Term)
	case *hraft.InstallSnapshotRequest:
		h.saw(c.Term)
	}
}

// heardTransport is the member's raft transport, recording in heard the
// term of every RPC raft receives before raft sees it, and refusing replies
// to AppendEntries that came back later than within.
type heardTransport struct {
	*hraft.NetworkTransport
	heard  *heardLog
	rpcs   chan hraft.RPC
	within time.Duration
	// whoIs returns the ID of the member that answers at an address.
	whoIs func(target hraft.ServerAddress) (string, error)
}

func (n *Node) newHeardTransport(t *hraft.NetworkTransport) *heardTransport {
	ht := &heardTransport{NetworkTransport: t, heard: n.heard, rpcs: make(chan hraft.RPC), within: n.opts.HeartbeatTimeout / 2,
		whoIs: func(target hraft.ServerAddress) (string, error) {
			ctx, cancel := context.WithTimeout(n.ctx, max(n.opts.HeartbeatTimeout, time.Second))
			defer cancel()
			var in nodeInfo
			err := n.client.call(ctx, string(target), "/v1/raft/info", nil, &in, false)
			return in.ID, err
		}}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		in := t.Consumer()
		for {
			select {
			case <-n.ctx.Done():
				return
			case rpc := <-in:
				ht.heard.note(rpc)
				select {
				case ht.rpcs <- rpc:
				case <-n.ctx.Done():
					return
				}
			}
		}
	}()
	return ht
}

// Consumer implements hraft.Transport.
func (t *heardTransport) Consumer() <-chan hraft.RPC { return t.rpcs }

// SetHeartbeatHandler implements hraft.Transport.
func (t *heardTransport) SetHeartbeatHandler(fn func(hraft.RPC)) {
	if fn == nil {
		t.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	t.NetworkTransport.SetHeartbeatHandler(func(rpc hraft.RPC) {
		t.heard.note(rpc)
		fn(rpc)
	})
}

// RequestVote implements hraft.Transport. A vote counts only from the
// member the configuration names at target: raft sends a vote request to
// an address, and a member that came up there since (a new instance given
// a dead one's IP, a member restarted without its log) has no log and would
// grant it, standing in for a voter whose log it does not have.
func (t *heardTransport) RequestVote(id hraft.ServerID, target hraft.ServerAddress, args *hraft.RequestVoteRequest, resp *hraft.RequestVoteResponse) error {
	if err := t.checkVoter(id, target); err != nil {
		return err
	}
	return t.NetworkTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote implements hraft.WithPreVote, with RequestVote's check.
func (t *heardTransport) RequestPreVote(id hraft.ServerID, target hraft.ServerAddress, args *hraft.RequestPreVoteRequest, resp *hraft.RequestPreVoteResponse) error {
	if err := t.checkVoter(id, target); err != nil {
		return err
	}
	return t.NetworkTransport.RequestPreVote(id, target, args, resp)
}

// checkVoter reports an error unless the member at target is id.
func (t *heardTransport) checkVoter(id hraft.ServerID, target hraft.ServerAddress) error {
	if t.whoIs == nil {
		return nil
	}
	got, err := t.whoIs(target)
	if err != nil {
		return err
	}
	if got != string(id) {
		return fmt.Errorf("raft: %s answers at %s, not the voter %s: its vote would stand in for %s's", got, target, id, id)
	}
	return nil
}

// AppendEntries implements hraft.Transport. A reply that came back more
// than within after the call began counts as no reply (raft retries the
// call): raft would count it towards the leadership check of a renewal
// that arrived after the voter had received the RPC, and a new raft
// leader's margin covers only within of that (see the top of this file).
// Between members that reach each other in milliseconds, a reply that late
// comes only across a network blip or a stalled member.
func (t *heardTransport) AppendEntries(id hraft.ServerID, target hraft.ServerAddress, args *hraft.AppendEntriesRequest, resp *hraft.AppendEntriesResponse) error {
	start := time.Now()
	if err := t.NetworkTransport.AppendEntries(id, target, args, resp); err != nil {
		return err
	}
	if took := time.Since(start); took > t.within {
		return fmt.Errorf("raft: %s answered an AppendEntries %s after it was sent, later than %s (half a heartbeat timeout): counted as no answer",
			id, took.Round(time.Millisecond), t.within)
	}
	return nil
}

// heardReply is a member's answer to a new raft leader.
type heardReply struct {
	ID   string        `json:"id"`
	Term uint64        `json:"term"` // the member's current term, read first
	Ago  time.Duration `json:"ago"`  // since it last heard from (or was) a leader of a term below the asked one
}

func (n *Node) heardSince(term uint64, self bool) heardReply {
	cur := n.raft.CurrentTerm()
	return heardReply{ID: n.id, Term: cur, Ago: time.Since(n.heard.before(term, self))}
}

func (n *Node) serveHeard(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, n.heardSince(parseUint(r.URL.Query().Get("term")), false))
}

// sessionBase returns the moment from which this new raft leader of term
// may time every session (see the comment at the top of this file): the
// latest receipt that a quorum of voters in term or later report, plus half
// a heartbeat timeout, or now when no quorum answers within a heartbeat
// timeout (at least a second).
func (n *Node) sessionBase(ctx context.Context, term uint64) time.Time {
	now := time.Now()
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return now
	}
	var voters []hraft.Server
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == hraft.Voter {
			voters = append(voters, s)
		}
	}
	quorum := len(voters)/2 + 1
	// At least a second: an answer that comes late still gives a base
	// earlier than now, and a short heartbeat timeout on a loaded host
	// should not cost every session a full TTL.
	cctx, cancel := context.WithTimeout(ctx, max(n.opts.HeartbeatTimeout, time.Second))
	defer cancel()
	// Each voter's answer: the receipt it reports on this member's clock,
	// or ok false.
	type answer struct {
		at time.Time
		ok bool
	}
	answers := make(chan answer, len(voters))
	for _, s := range voters {
		go func() {
			var in heardReply
			if string(s.ID) == n.id {
				in = n.heardSince(term, true)
			} else if err := n.client.call(cctx, string(s.Address), "/v1/raft/heard?term="+strconv.FormatUint(term, 10), nil, &in, false); err != nil {
				answers <- answer{}
				return
			}
			// The reply left the voter before it arrived: dating the
			// receipt from the arrival puts it no earlier than it was.
			at := time.Now().Add(-in.Ago)
			answers <- answer{at: at, ok: in.ID == string(s.ID) && in.Term >= term}
		}()
	}
	// The latest receipt of any quorum in term or later will do: more
	// answers could only move the base later.
	var base time.Time
	got := 0
	for range voters {
		a := <-answers
		if !a.ok {
			continue
		}
		got++
		if a.at.After(base) {
			base = a.at
		}
		if got == quorum {
			// A base after now (a voter that led until it answered)
			// gives way to now: a full TTL from the start of this
			// leader's timers covers what a leader of an earlier term
			// confirmed, as a quorum is past that term already.
			base = base.Add(n.opts.HeartbeatTimeout / 2)
			if now := time.Now(); base.After(now) {
				return now
			}
			return base
		}
	}
	return time.Now()
}

// stallWatch notices that this process stood still: its ticker, due every
// period, ran late by more than gap.
type stallWatch struct {
	gap, after time.Duration

	mu      sync.Mutex
	last    time.Time // the ticker's last run
	resumed time.Time // the end of the last stall seen
}

// period is how often the ticker runs: a quarter of gap. A stall longer
// than gap is seen whatever the period (the ticks on either side of it are
// at least that far apart, and recent compares now with the last tick);
// the period only sets how far below gap the ticker's normal lateness
// stays, and a tick late under load reads as a stall, which delays
// renewals and is safe. Every wake-up costs an idle process CPU (a 10 ms
// ticker per member is 100 wake-ups a second each), so the period is no
// shorter than it needs to be.
func (s *stallWatch) period() time.Duration { return max(s.gap/4, time.Millisecond) }

func (n *Node) watchStalls() {
	defer n.wg.Done()
	t := time.NewTicker(n.stalls.period())
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.stalls.tick(time.Now())
		}
	}
}

func (s *stallWatch) tick(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.last) > s.gap {
		s.resumed = now
	}
	s.last = now
}

// recent reports whether the process stands still now (the ticker is
// late), or did less than after ago.
func (s *stallWatch) recent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	return now.Sub(s.last) > s.gap || now.Sub(s.resumed) < s.after
}

// verifyLeader confirms with a quorum that this member still leads, for a
// renewal: not right after this process stood still, when the quorum's
// replies may be old ones (see the top of this file).
func (n *Node) verifyLeader() error {
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return err
	}
	if n.stalls.recent() {
		return errors.New("raft: this member just stood still; its quorum's replies may predate it")
	}
	return nil
}
