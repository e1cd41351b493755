package raft

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

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
	mux.HandleFunc("POST /v1/raft/apply", n.serveApply)
	mux.HandleFunc("POST /v1/raft/renew", n.serveRenew)
	mux.HandleFunc("GET /v1/raft/lease", n.serveLease)
	mux.HandleFunc("GET /v1/raft/leases", n.serveLeases)
	mux.HandleFunc("GET /v1/raft/state", n.serveState)
	mux.HandleFunc("POST /v1/raft/join", n.serveJoin)
	mux.HandleFunc("POST /v1/raft/leave", n.serveLeave)
	return n.authorize(mux)
}

// ClientHandler serves the calls of Clients (agent:// backends) that
// campaign through this member: `baton agent` mounts it on its local HTTP
// address. token, when not empty, must come as "Authorization: Bearer
// TOKEN".
func (n *Node) ClientHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/raft/apply", n.serveClientApply)
	mux.HandleFunc("POST /v1/raft/renew", n.serveClientRenew)
	mux.HandleFunc("GET /v1/raft/lease", n.serveLease)
	mux.HandleFunc("GET /v1/raft/state", n.serveState)
	if token == "" {
		return mux
	}
	return bearer(token, mux)
}

func (n *Node) authorize(next http.Handler) http.Handler { return bearer(n.secret, next) }

func bearer(secret string, next http.Handler) http.Handler {
	want := []byte("Bearer " + secret)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			http.Error(w, "wrong or missing secret (Authorization: Bearer ...)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
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

func (n *Node) serveApply(w http.ResponseWriter, r *http.Request) {
	var c command
	if !readJSON(w, r, &c) {
		return
	}
	n.leaderOnly(w, r, &c, func() (any, error) { return n.applyLocal(c) })
}

// serveClientApply is serveApply for agent clients: a session they create
// is recorded as made through this member.
func (n *Node) serveClientApply(w http.ResponseWriter, r *http.Request) {
	var c command
	if !readJSON(w, r, &c) {
		return
	}
	if c.Op == opSessionCreate {
		c.Node, c.Agent = n.id, true
	}
	n.leaderOnly(w, r, &c, func() (any, error) { return n.applyLocal(c) })
}

func (n *Node) serveRenew(w http.ResponseWriter, r *http.Request) {
	var req renewRequest
	if !readJSON(w, r, &req) {
		return
	}
	n.leaderOnly(w, r, &req, func() (any, error) { return n.renewLocal(req.Session) })
}

// serveClientRenew is serveRenew for agent clients, reported to
// NodeOptions.OnRenew.
func (n *Node) serveClientRenew(w http.ResponseWriter, r *http.Request) {
	var req renewRequest
	if !readJSON(w, r, &req) {
		return
	}
	start := time.Now()
	var err error
	n.leaderOnly(w, r, &req, func() (any, error) {
		resp, rerr := n.renewLocal(req.Session)
		err = rerr
		return resp, rerr
	}, func(ferr error) { err = ferr })
	n.onRenew(time.Since(start), err)
}

// onRenew reports a renewal to NodeOptions.OnRenew.
func (n *Node) onRenew(took time.Duration, err error) {
	if n.opts.OnRenew != nil {
		n.opts.OnRenew(took, err)
	}
}

// renewLocal confirms with a quorum that this member still leads, then
// gives the session a full TTL. The confirmation comes after the renewal
// was sent, so a leader elected later starts the session's timer later
// than the sender's safe-until is measured from.
func (n *Node) renewLocal(session string) (*renewResponse, error) {
	if err := n.raft.VerifyLeader().Error(); err != nil {
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
	secret string
	hc     *http.Client
	tr     *http.Transport // nil when hc is the caller's
	scheme string          // "https" (members, over the mux) or "http" (agent clients)
}

func newAPIClient(cfg *tls.Config, g *gate, secret string) *apiClient {
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialProto(ctx, cfg, g, addr, protoAPI)
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
	if c.secret != "" {
		req.Header.Set("Authorization", "Bearer "+c.secret)
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
