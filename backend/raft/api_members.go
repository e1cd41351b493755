package raft

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	hraft "github.com/hashicorp/raft"
)

func (n *Node) serveJoin(w http.ResponseWriter, r *http.Request) {
	var req joinRequest
	if !readJSON(w, r, &req) {
		return
	}
	n.leaderOnly(w, r, &req, func() (any, error) { return struct{}{}, n.addMember(req) })
}

func (n *Node) serveLeave(w http.ResponseWriter, r *http.Request) {
	var req joinRequest
	if !readJSON(w, r, &req) {
		return
	}
	n.leaderOnly(w, r, &req, func() (any, error) {
		n.promoteReplacement(req.ID)
		if err := n.removeServer(hraft.ServerID(req.ID)); err != nil {
			return nil, fmt.Errorf("%w: remove %s: %w", ErrNotLeader, req.ID, err)
		}
		n.log.Info("member left", "id", req.ID, "addr", req.Addr)
		return struct{}{}, nil
	})
}

// promoteReplacement makes a healthy non-voter a voter before the voter
// leaving is removed, so that the group never runs on fewer voters than it
// had: with three, a leave followed by a crash before autopilot promoted a
// replacement would otherwise cost the quorum.
func (n *Node) promoteReplacement(leaving string) {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	var isVoter bool
	var non []hraft.Server
	for _, s := range f.Configuration().Servers {
		switch {
		case string(s.ID) == leaving:
			isVoter = s.Suffrage == hraft.Voter
		case s.Suffrage == hraft.Nonvoter:
			non = append(non, s)
		}
	}
	if !isVoter {
		return
	}
	_, lastTerm := n.lastLog()
	for _, s := range non {
		// Ask the candidate itself: autopilot may not have judged a member
		// that joined moments ago.
		ctx, cancel := context.WithTimeout(n.ctx, time.Second)
		var in nodeInfo
		err := n.client.call(ctx, string(s.Address), "/v1/raft/info", nil, &in, false)
		cancel()
		if err != nil || in.ID != string(s.ID) || in.LastTerm != lastTerm || in.LastIndex+500 < n.raft.LastIndex() {
			continue
		}
		if err := n.await(n.raft.AddVoter(s.ID, s.Address, 0, 5*time.Second)); err != nil {
			n.log.Warn("could not promote a replacement for a leaving voter", "leaving", leaving, "replacement", s.ID, "err", err)
			return
		}
		n.log.Info("promoted a replacement for a leaving voter", "leaving", leaving, "replacement", s.ID)
		return
	}
}

// lastLog returns the index and term of this member's last log entry.
func (n *Node) lastLog() (uint64, uint64) {
	stats := n.raft.Stats()
	term, _ := strconv.ParseUint(stats["last_log_term"], 10, 64)
	return n.raft.LastIndex(), term
}

// addMember adds a joining member: a witness as a voter at once (it exists
// only to vote), any other as a non-voter that autopilot promotes while
// there are fewer than Voters healthy voters.
func (n *Node) addMember(req joinRequest) error {
	if req.ID == "" {
		return &apiError{Status: http.StatusBadRequest, Msg: "join without an id"}
	}
	if _, _, err := net.SplitHostPort(req.Addr); err != nil {
		return &apiError{Status: http.StatusBadRequest, Msg: fmt.Sprintf("join with a bad address %q", req.Addr)}
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	for _, s := range f.Configuration().Servers {
		switch {
		case string(s.ID) == req.ID && string(s.Address) == req.Addr:
			return nil // already in
		case string(s.ID) == req.ID:
			// A member restarted with its log at a new address: raft
			// updates the address in place when the ID is re-added with its
			// suffrage (removing it would make a leader remove itself).
			fut := n.raft.AddNonvoter(s.ID, hraft.ServerAddress(req.Addr), 0, 5*time.Second)
			if s.Suffrage == hraft.Voter {
				fut = n.raft.AddVoter(s.ID, hraft.ServerAddress(req.Addr), 0, 5*time.Second)
			}
			if err := n.await(fut); err != nil {
				return fmt.Errorf("%w: move %s to %s: %w", ErrNotLeader, s.ID, req.Addr, err)
			}
			n.log.Info("member moved", "id", req.ID, "from", s.Address, "to", req.Addr)
			return nil
		case string(s.Address) == req.Addr:
			// A new member at a dead one's address (an instance replaced
			// in place): the old entry goes first.
			if err := n.removeServer(s.ID); err != nil {
				return fmt.Errorf("%w: replace %s: %w", ErrNotLeader, s.ID, err)
			}
		}
	}
	var fut hraft.IndexFuture
	if req.Witness {
		fut = n.raft.AddVoter(hraft.ServerID(req.ID), hraft.ServerAddress(req.Addr), 0, 5*time.Second)
	} else {
		fut = n.raft.AddNonvoter(hraft.ServerID(req.ID), hraft.ServerAddress(req.Addr), 0, 5*time.Second)
	}
	if err := n.await(fut); err != nil {
		return fmt.Errorf("%w: add %s: %w", ErrNotLeader, req.ID, err)
	}
	n.mu.Lock()
	n.lastSeen[hraft.ServerID(req.ID)] = time.Now()
	n.mu.Unlock()
	n.log.Info("member joined", "id", req.ID, "addr", req.Addr, "witness", req.Witness)
	return nil
}
