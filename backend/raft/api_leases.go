package raft

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/httpauth"
)

// serveApply applies a command a member sends for its own Backends. It
// refuses what only the raft leader itself does (expiring a session) and
// anything on an agent client's session, which goes through the client API
// with the session's secret.
func (n *Node) serveApply(w http.ResponseWriter, r *http.Request) {
	var c command
	if !readJSON(w, r, &c) {
		return
	}
	n.leaderOnly(w, r, &c, func() (any, error) {
		if err := n.memberCommandAllowed(c); err != nil {
			return nil, err
		}
		return n.applyLocal(c)
	})
}

// memberCommandAllowed refuses, on the raft leader, the commands a member
// may not send: leader-only ones, and any that acts on (or creates) an
// agent client's session.
func (n *Node) memberCommandAllowed(c command) error {
	switch c.Op {
	case opSessionCreate, opSessionDestroy, opAcquire, opRelease, opDequeue, opStateStore:
	case opRequestResign:
		return nil
	default:
		return &apiError{Status: http.StatusForbidden, Msg: fmt.Sprintf("operation %q is the raft leader's own; no member may send it", c.Op)}
	}
	if c.Agent || len(c.Auth) > 0 {
		return &apiError{Status: http.StatusForbidden, Msg: "an agent client's session is created through the client API"}
	}
	if s, ok := n.fsm.session(c.Session); ok && s.Agent {
		return &apiError{Status: http.StatusForbidden, Msg: fmt.Sprintf("session %s is an agent client's: only its holder acts on it, through the client API", c.Session)}
	}
	return nil
}

// serveClientApply serves an agent client's request about its own session
// (clientRequest): on the client API (local), and on the group API when the
// member the client talks to forwards it.
func (n *Node) serveClientApply(w http.ResponseWriter, r *http.Request, local bool) {
	var req clientRequest
	if !readJSON(w, r, &req) {
		return
	}
	if local {
		req.Member = n.id // the member the client talks to: this one
		r.Header.Del(forwardedHeader)
	}
	n.leaderOnly(w, r, &req, func() (any, error) { return n.clientApplyLocal(req) })
}

// clientApplyLocal checks req's session secret on the raft leader and
// applies the command it asks for.
func (n *Node) clientApplyLocal(req clientRequest) (*result, error) {
	c, err := req.command()
	if err != nil {
		return nil, err
	}
	c.Time = n.now()
	if req.Op == opSessionCreate {
		// The client's own RenewInterval and DriftMargin are its own: judge
		// the TTL at the defaults.
		if err := CheckTiming(backend.Config{TTL: req.TTL}, n.opts.HeartbeatTimeout); err != nil {
			return nil, err
		}
	}
	if req.Op != opSessionCreate {
		switch err := n.checkClientSession(req.Session, req.Secret); {
		case errors.Is(err, errSessionGone):
			// What the log would answer, without a command naming a
			// session nobody can prove is theirs.
			return &result{Err: errUnknownSession, Lost: true}, nil
		case err != nil:
			return nil, err
		}
	}
	res, err := n.applyLocal(c)
	if err == nil && req.Op == opAcquire {
		n.checkTokenAboveHeld(req.Lease, req.Session, res, req.Token)
	}
	return res, err
}

// checkClientSession checks, on the raft leader, that secret is the secret
// of session, an agent client's session: errSessionGone when the log has
// no such session, a 403 apiError when the secret is wrong or the session
// is not an agent client's.
func (n *Node) checkClientSession(session, secret string) error {
	if !n.isReady() {
		return ErrNotLeader
	}
	s, ok := n.fsm.session(session)
	if !ok {
		return errSessionGone
	}
	var want httpauth.Digest
	copy(want[:], s.Auth)
	if !s.Agent || len(s.Auth) != len(want) || !httpauth.Match(secret, want) {
		return &apiError{Status: http.StatusForbidden, Msg: fmt.Sprintf("wrong secret for session %s: only the client that created a session may act on it", session)}
	}
	return nil
}

// serveRenew renews a member's own session.
func (n *Node) serveRenew(w http.ResponseWriter, r *http.Request) {
	var req renewRequest
	if !readJSON(w, r, &req) {
		return
	}
	n.leaderOnly(w, r, &req, func() (any, error) {
		if s, ok := n.fsm.session(req.Session); ok && s.Agent {
			return nil, &apiError{Status: http.StatusForbidden, Msg: fmt.Sprintf("session %s is an agent client's: it renews through the client API", req.Session)}
		}
		return n.renewLocal(req.Session)
	})
}

// serveClientRenew renews an agent client's session, after checking its
// secret; on the client API (local) it is reported to NodeOptions.OnRenew.
func (n *Node) serveClientRenew(w http.ResponseWriter, r *http.Request, local bool) {
	if local {
		r.Header.Del(forwardedHeader)
	}
	var req renewRequest
	if !readJSON(w, r, &req) {
		return
	}
	start := time.Now()
	var err error
	n.leaderOnly(w, r, &req, func() (any, error) {
		if cerr := n.checkClientSession(req.Session, req.Secret); cerr != nil {
			if errors.Is(cerr, errSessionGone) {
				cerr = &apiError{Status: http.StatusNotFound, Msg: errUnknownSession}
			}
			err = cerr
			return nil, cerr
		}
		resp, rerr := n.renewLocal(req.Session)
		err = rerr
		return resp, rerr
	}, func(ferr error) { err = ferr })
	if local {
		n.onRenew(time.Since(start), err)
	}
}

// onRenew reports a renewal to NodeOptions.OnRenew.
func (n *Node) onRenew(took time.Duration, err error) {
	if n.opts.OnRenew != nil {
		n.opts.OnRenew(took, err)
	}
}

// renewLocal confirms with a quorum that this member still leads, then
// gives the session a full TTL. The confirmation comes after the renewal
// was sent, so a leader elected later times the session from no earlier
// than the sender's safe-until is measured from (heard.go).
func (n *Node) renewLocal(session string) (*renewResponse, error) {
	if err := n.verifyLeader(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	ttl, ok := n.timers.touch(session)
	if !ok {
		if !n.isReady() {
			return nil, ErrNotLeader
		}
		return nil, &apiError{Status: http.StatusNotFound, Msg: errUnknownSession}
	}
	return &renewResponse{TTL: ttl, Resign: n.fsm.resigns(session)}, nil
}

func (n *Node) serveLease(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name, session := q.Get("name"), q.Get("session")
	if q.Get("stale") != "" {
		// A local read, for clients that asked for one, optionally
		// blocking until the lease changes after index.
		wait, _ := time.ParseDuration(q.Get("wait"))
		v, err := n.waitLease(r.Context(), name, session, parseUint(q.Get("min")), parseUint(q.Get("after")), min(wait, 5*time.Minute))
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, v)
		return
	}
	n.leaderOnly(w, r, nil, func() (any, error) { return n.readLocal(name, session) })
}

// readLocal is a linearizable read on the leader: it confirms leadership
// with a quorum, and every write acknowledged before is applied here.
func (n *Node) readLocal(name, session string) (leaseView, error) {
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return leaseView{}, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	v, _ := n.fsm.lease(name, session)
	return v, nil
}

func (n *Node) serveState(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	n.leaderOnly(w, r, nil, func() (any, error) { return n.stateLocal(name) })
}

// stateLocal reads name's state on the raft leader, linearizably as
// readLocal does.
func (n *Node) stateLocal(name string) (stateView, error) {
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return stateView{}, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return n.fsm.state(name), nil
}

// waitLease blocks like wait, but returns the current state when wait
// runs out.
func (n *Node) waitLease(ctx context.Context, name, session string, minIndex, after uint64, wait time.Duration) (leaseView, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	v, err := n.wait(wctx, name, session, minIndex, after)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		v, _ = n.fsm.lease(name, session)
		return v, nil
	}
	return v, err
}

// readManyRequest asks for the state of many leases in one call (POST
// /v1/raft/read): through the raft leader, or from the answering
// member's copy of the log when Stale.
type readManyRequest struct {
	Names []string `json:"names"`
	Stale bool     `json:"stale,omitempty"`
}

// maxReadMany is the most names one read call may ask for.
const maxReadMany = 1024

func (n *Node) serveReadMany(w http.ResponseWriter, r *http.Request) {
	var req readManyRequest
	if !readJSON(w, r, &req) {
		return
	}
	if len(req.Names) > maxReadMany {
		http.Error(w, fmt.Sprintf("%d names asked for; at most %d a call", len(req.Names), maxReadMany), http.StatusBadRequest)
		return
	}
	if req.Stale {
		writeJSON(w, n.staleMany(req.Names))
		return
	}
	n.leaderOnly(w, r, &req, func() (any, error) { return n.readManyLocal(req.Names) })
}

// readManyLocal is readLocal for many leases, with one confirmation of
// leadership for all of them.
func (n *Node) readManyLocal(names []string) ([]leaseView, error) {
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return n.staleMany(names), nil
}

// staleMany reads names from this member's copy of the log.
func (n *Node) staleMany(names []string) []leaseView {
	vs := make([]leaseView, len(names))
	for i, name := range names {
		vs[i], _ = n.fsm.lease(name, "")
	}
	return vs
}

// heldRequest asks a member which of a session's terms its copy of the log
// no longer gives them (POST /v1/raft/held): an agent client's one
// long-poll for every lease it holds.
type heldRequest struct {
	Session string `json:"session"`
	// Terms maps each held lease's name to its term's token.
	Terms map[string]uint64 `json:"terms"`
	// Min is the highest index of the entries that granted the terms: the
	// member judges once its copy of the log has applied it.
	Min uint64 `json:"min"`
	// Wait is how long to wait for a term to be lost (a Go duration; at
	// most 5 minutes).
	Wait string `json:"wait,omitempty"`
}

// heldResponse names the leases of a heldRequest whose terms the log no
// longer gives them; none when the wait ran out first.
type heldResponse struct {
	Lost []string `json:"lost"`
}

// maxHeldTerms is the most terms one held call may name.
const maxHeldTerms = 20000

func (n *Node) serveHeld(w http.ResponseWriter, r *http.Request) {
	var req heldRequest
	if !readJSON(w, r, &req) {
		return
	}
	if len(req.Terms) > maxHeldTerms {
		http.Error(w, fmt.Sprintf("%d terms named; at most %d a call", len(req.Terms), maxHeldTerms), http.StatusBadRequest)
		return
	}
	wait, _ := time.ParseDuration(req.Wait)
	ctx, cancel := context.WithTimeout(r.Context(), min(max(wait, 0), 5*time.Minute))
	defer cancel()
	lost, err := n.waitHeld(ctx, req)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, heldResponse{Lost: lost})
}

// waitHeld returns the leases of req whose terms this copy of the log, once
// it applied req.Min, gives to anything but req's session and token: at
// once when there are some, else at the first change that makes some, or
// with none when ctx ends. One subscription to the log's lease events
// serves every lease named, and a change looks up only its own lease (all
// of them after a snapshot restore, whose entries give no events).
func (n *Node) waitHeld(ctx context.Context, req heldRequest) ([]string, error) {
	wake := make(chan struct{}, 1)
	var (
		mu    sync.Mutex
		all   = true // look up every lease: at first, and after a restore
		dirty = map[string]bool{}
	)
	sub := n.fsm.subscribe(func(ev LeaseEvent) {
		mu.Lock()
		switch _, named := req.Terms[ev.Lease]; {
		case ev.Kind == eventRestored:
			all = true
		case named:
			dirty[ev.Lease] = true
		default:
			mu.Unlock()
			return
		}
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}, true)
	defer n.fsm.unsubscribe(sub)
	go sub.run(ctx.Done())
	for {
		idx, applied := n.fsm.applied()
		if idx >= req.Min {
			break
		}
		select {
		case <-applied:
		case <-ctx.Done():
			return nil, nil
		case <-n.ctx.Done():
			return nil, errNodeClosed
		}
	}
	for {
		mu.Lock()
		var names []string
		if all {
			for name := range req.Terms {
				names = append(names, name)
			}
		} else {
			for name := range dirty {
				names = append(names, name)
			}
		}
		all, dirty = false, map[string]bool{}
		mu.Unlock()
		var lost []string
		for _, name := range names {
			if _, session, token := n.fsm.holder(name); session != req.Session || token != req.Terms[name] {
				lost = append(lost, name)
			}
		}
		if len(lost) > 0 {
			return lost, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, nil
		case <-n.ctx.Done():
			return nil, errNodeClosed
		}
	}
}
