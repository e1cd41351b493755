package raft

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/batonhq/baton/internal/httpauth"
	"github.com/batonhq/baton/internal/httpjson"
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
	mux.HandleFunc("POST /v1/raft/read", n.serveReadMany)
	mux.HandleFunc("POST /v1/raft/held", n.serveHeld)
	mux.HandleFunc("GET /v1/raft/state", n.serveState)
	mux.HandleFunc("POST /v1/raft/join", n.serveJoin)
	mux.HandleFunc("POST /v1/raft/leave", n.serveLeave)
	mux.HandleFunc("POST /v1/raft/recover", n.serveRecover)
	// No token is asked for: the mux hands a connection to this handler
	// only after it proved the group's secret, bound to its TLS session,
	// and a bearer token would have to follow the secret through a
	// rotation for nothing.
	return mux
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
	mux.HandleFunc("POST /v1/raft/read", n.serveReadMany)
	mux.HandleFunc("POST /v1/raft/held", n.serveHeld)
	mux.HandleFunc("GET /v1/raft/state", n.serveState)
	return mux, nil
}

func writeJSON(w http.ResponseWriter, v any) { httpjson.Write(w, http.StatusOK, v) }

func writeErr(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var ae *apiError
	var te *TTLError
	if errors.As(err, &ae) && ttlRefusal(ae) != nil {
		te = ttlRefusal(ae) // the raft leader's refusal, passed on by a follower
	}
	if te != nil || errors.As(err, &te) {
		httpjson.Write(w, statusTTLRefused, te)
		return
	}
	switch {
	case errors.As(err, &ae):
		status = ae.Status
	case errors.Is(err, ErrNotLeader):
		status = http.StatusServiceUnavailable
	}
	http.Error(w, err.Error(), status)
}

// ReadHandler serves the reads of Clients (agent:// backends) and nothing
// else: GET /v1/raft/lease, POST /v1/raft/read (many leases) and GET
// /v1/raft/state, which need no token and change nothing. `baton run --http` mounts it, so that `baton is-leader`
// and `baton leader` read from a raft:// member as they read from an agent.
// Every other path is 404.
func (n *Node) ReadHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/raft/lease", n.serveLease)
	mux.HandleFunc("POST /v1/raft/read", n.serveReadMany)
	mux.HandleFunc("POST /v1/raft/held", n.serveHeld)
	mux.HandleFunc("GET /v1/raft/state", n.serveState)
	return mux
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
