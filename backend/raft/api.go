package raft

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/httpauth"
	hraft "github.com/hashicorp/raft"
)

// The group API: members call each other's over the mux (mutual TLS plus
// the group's secret). A follower forwards what only the leader can do, at
// most one hop; the leader answers 503 when it is not (or not yet) leading,
// and the caller retries.

const forwardedHeader = "X-Baton-Forwarded"

type joinRequest struct {
	ID      string `json:"id"`
	Addr    string `json:"addr"`
	Witness bool   `json:"witness,omitempty"`
}

type renewRequest struct {
	Session string `json:"session"`
	// Secret is an agent client's session secret, on the client API.
	Secret string `json:"secret,omitempty"`
}

// clientRequest is what an agent client may ask of its own session on the
// client API (Node.ClientHandler): create it, destroy it, campaign, release,
// leave a queue, store the lease's state. It is not a log command: the raft
// leader checks Secret against the session's digest in the log and builds
// the command itself, so a caller cannot name an operation the client API
// does not offer, or act on a session whose secret it does not have.
type clientRequest struct {
	Op        op            `json:"op"`
	Session   string        `json:"session"`
	Secret    string        `json:"secret"`
	TTL       time.Duration `json:"ttl,omitempty"`
	Lease     string        `json:"lease,omitempty"`
	Candidate string        `json:"candidate,omitempty"`
	Token     uint64        `json:"token,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	Value     []byte        `json:"value,omitempty"`
	// Member is the node ID of the member the client talks to, recorded
	// with a session it creates. That member sets it; a client's own value
	// is overwritten.
	Member string `json:"member,omitempty"`
}

// minSessionSecret is the shortest session secret the client API accepts.
const minSessionSecret = 16

// command returns the log command req asks for, or an error naming what
// the client API refuses.
func (req *clientRequest) command() (command, error) {
	// The time is the member's own: a first acquire sets the group's epoch
	// from it, which a client must not choose.
	c := command{Op: req.Op, Session: req.Session, Time: time.Now()}
	if req.Session == "" {
		return c, &apiError{Status: http.StatusBadRequest, Msg: "no session named"}
	}
	switch req.Op {
	case opSessionCreate:
		if len(req.Secret) < minSessionSecret {
			return c, &apiError{Status: http.StatusBadRequest, Msg: fmt.Sprintf("a session secret of at least %d bytes is required", minSessionSecret)}
		}
		if req.TTL <= 0 {
			return c, &apiError{Status: http.StatusBadRequest, Msg: "a session needs a positive ttl"}
		}
		d := httpauth.DigestOf(req.Secret)
		c.Node, c.Agent, c.TTL, c.Auth = req.Member, true, req.TTL, d[:]
	case opSessionDestroy:
		if req.Reason != "" && req.Reason != reasonExpired {
			return c, &apiError{Status: http.StatusBadRequest, Msg: fmt.Sprintf("session-destroy reason %q: want %q or none", req.Reason, reasonExpired)}
		}
		c.Reason = req.Reason
	case opAcquire:
		c.Lease, c.Candidate = req.Lease, req.Candidate
	case opRelease:
		c.Lease, c.Token = req.Lease, req.Token
	case opDequeue:
		c.Lease = req.Lease
	case opStateStore:
		c.Lease, c.Token, c.Value = req.Lease, req.Token, req.Value
	default:
		return c, &apiError{Status: http.StatusForbidden, Msg: fmt.Sprintf(
			"operation %q is not offered to clients: they may create and destroy their session, acquire, release, dequeue and store state", req.Op)}
	}
	if req.Op != opSessionCreate && req.Op != opSessionDestroy && req.Lease == "" {
		return c, &apiError{Status: http.StatusBadRequest, Msg: "no lease named"}
	}
	return c, nil
}

type renewResponse struct {
	TTL time.Duration `json:"ttl"`
	// Resign lists the leases the session holds whose resign was requested
	// (Node.RequestResign); the holder stops the work of those terms, then
	// releases.
	Resign []resignOrder `json:"resign,omitempty"`
}

// nodeInfo is what a member tells a peer about itself.
type nodeInfo struct {
	ID          string        `json:"id"`
	Addr        string        `json:"addr"`
	State       string        `json:"state"`
	HasState    bool          `json:"has_state"` // in a group, or was
	Leader      string        `json:"leader,omitempty"`
	LeaderID    string        `json:"leader_id,omitempty"`
	LastIndex   uint64        `json:"last_index"`
	LastTerm    uint64        `json:"last_term"`
	LastContact time.Duration `json:"last_contact"` // -1: never
	Witness     bool          `json:"witness,omitempty"`
}

// apiError is an error status from a peer.
type apiError struct {
	Status int
	Msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("group API: %d %s", e.Status, e.Msg) }

func (n *Node) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/raft/info", n.serveInfo)
	mux.HandleFunc("GET /v1/raft/heard", n.serveHeard)
	mux.HandleFunc("POST /v1/raft/apply", n.serveApply)
	mux.HandleFunc("POST /v1/raft/renew", n.serveRenew)
	mux.HandleFunc("POST /v1/raft/client/apply", func(w http.ResponseWriter, r *http.Request) { n.serveClientApply(w, r, false) })
	mux.HandleFunc("POST /v1/raft/client/renew", func(w http.ResponseWriter, r *http.Request) { n.serveClientRenew(w, r, false) })
	mux.HandleFunc("GET /v1/raft/lease", n.serveLease)
	mux.HandleFunc("GET /v1/raft/leases", n.serveLeases)
	mux.HandleFunc("GET /v1/raft/state", n.serveState)
	mux.HandleFunc("POST /v1/raft/join", n.serveJoin)
	mux.HandleFunc("POST /v1/raft/leave", n.serveLeave)
	return n.authorize(mux)
}

// ClientHandler serves the calls of Clients (agent:// backends) that
// campaign through this member: `baton agent` mounts it on its local HTTP
// address. It offers a client only what it may do to its own session —
// create and destroy it, renew it, acquire, release, leave a queue, store
// the lease's state — and reads. Each call that changes something needs
// "Authorization: Bearer TOKEN" with token, which must not be empty, and,
// for an existing session, the secret the session was created with: a
// session ID read from the lease table is not enough to act on it. The
// log commands are built by the raft leader, never taken from the caller;
// sessions expire only by the raft leader's own timers. Reads (the lease,
// its state) need no token.
func (n *Node) ClientHandler(token string) (http.Handler, error) {
	b, err := httpauth.NewBearer(token)
	if err != nil {
		return nil, fmt.Errorf("raft: ClientHandler: %w", err)
	}
	deny := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "this call needs the agent's token: Authorization: Bearer TOKEN (the agent's --http-token, or the token file it writes at start)", http.StatusUnauthorized)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/raft/client/apply", b.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.serveClientApply(w, r, true)
	}), deny))
	mux.Handle("POST /v1/raft/client/renew", b.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.serveClientRenew(w, r, true)
	}), deny))
	mux.HandleFunc("GET /v1/raft/lease", n.serveLease)
	mux.HandleFunc("GET /v1/raft/state", n.serveState)
	return mux, nil
}

func (n *Node) authorize(next http.Handler) http.Handler {
	b, err := httpauth.NewBearer(n.secret)
	if err != nil {
		// StartNode refuses an empty secret; refuse everything all the same.
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "this member has no group secret", http.StatusUnauthorized)
		})
	}
	return b.Require(next, func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "wrong or missing secret (Authorization: Bearer ...)", http.StatusUnauthorized)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		status = ae.Status
	case errors.Is(err, ErrNotLeader):
		status = http.StatusServiceUnavailable
	}
	http.Error(w, err.Error(), status)
}

func (n *Node) info() nodeInfo {
	addr, lid := n.raft.LeaderWithID()
	stats := n.raft.Stats()
	term, _ := strconv.ParseUint(stats["last_log_term"], 10, 64)
	contact := time.Duration(-1)
	switch lc := stats["last_contact"]; {
	case n.raft.State() == hraft.Leader:
		contact = 0
	case lc == "never" || lc == "":
	default:
		if d, err := time.ParseDuration(lc); err == nil {
			contact = d
		}
	}
	has := n.raft.LastIndex() > 0
	return nodeInfo{
		ID: n.id, Addr: n.addr, State: n.raft.State().String(), HasState: has,
		Leader: string(addr), LeaderID: string(lid), LastIndex: n.raft.LastIndex(),
		LastTerm: term, LastContact: contact, Witness: n.opts.Witness,
	}
}

func (n *Node) serveInfo(w http.ResponseWriter, r *http.Request) { writeJSON(w, n.info()) }

// leaderOnly runs fn here if this member is the ready leader, or forwards
// the request body to the leader once. failed, if given, learns the error
// of a request that could not be forwarded.
func (n *Node) leaderOnly(w http.ResponseWriter, r *http.Request, body any, fn func() (any, error), failed ...func(error)) {
	report := func(err error) {
		for _, f := range failed {
			f(err)
		}
	}
	if n.isReady() {
		v, err := fn()
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, v)
		return
	}
	if r.Header.Get(forwardedHeader) != "" {
		report(ErrNotLeader)
		writeErr(w, ErrNotLeader)
		return
	}
	var out json.RawMessage
	if err := n.forwardJSON(r.Context(), r.URL.RequestURI(), body, &out); err != nil {
		report(err)
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(v); err != nil {
		http.Error(w, "bad request body: "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

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
	return n.applyLocal(c)
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
		if err := n.await(n.raft.RemoveServer(hraft.ServerID(req.ID), 0, 5*time.Second)); err != nil {
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
			if err := n.await(n.raft.RemoveServer(s.ID, 0, 5*time.Second)); err != nil {
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

// forwardJSON posts (or, with a nil body, gets) path on the raft leader.
func (n *Node) forwardJSON(ctx context.Context, path string, body, out any) error {
	addr, _ := n.raft.LeaderWithID()
	if addr == "" {
		return ErrNotLeader
	}
	if string(addr) == n.addr {
		return ErrNotLeader // we are it, but not ready yet
	}
	return n.client.call(ctx, string(addr), path, body, out, true)
}

// apiClient calls peers' group API.
type apiClient struct {
	mu     sync.Mutex
	secret string // the bearer token sent with each call; see bearer
	hc     *http.Client
	tr     *http.Transport // nil when hc is the caller's
	scheme string          // "https" (members, over the mux) or "http" (agent clients)
}

func newAPIClient(cfg *tls.Config, g *gate, secret string) *apiClient {
	key := newConnKey(secret)
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialProto(ctx, cfg, g, key, addr, protoAPI)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
	}
	return &apiClient{secret: secret, tr: tr, hc: &http.Client{Transport: tr}, scheme: "https"}
}

func (c *apiClient) close() {
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
}

// call does one request to the member at addr. A nil body makes it a GET,
// with path carrying any query.
func (c *apiClient) call(ctx context.Context, addr, path string, body, out any, forwarded bool) error {
	method := http.MethodGet
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		method, rd = http.MethodPost, bytes.NewReader(b)
	}
	u := url.URL{Scheme: c.scheme, Host: addr}
	req, err := http.NewRequestWithContext(ctx, method, u.String()+path, rd)
	if err != nil {
		return err
	}
	if tok := c.bearer(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if forwarded {
		req.Header.Set(forwardedHeader, "1")
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotLeader, addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotLeader, addr, err)
	}
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %s: %s", ErrNotLeader, addr, bytes.TrimSpace(b))
	case resp.StatusCode != http.StatusOK:
		return &apiError{Status: resp.StatusCode, Msg: string(bytes.TrimSpace(b))}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// bearer returns the token sent with each call.
func (c *apiClient) bearer() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.secret
}

// setBearer replaces the token sent with later calls.
func (c *apiClient) setBearer(tok string) {
	c.mu.Lock()
	c.secret = tok
	c.mu.Unlock()
}
