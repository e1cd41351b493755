// Package raftagent is the HTTP API of `baton agent`, a member of an
// embedded raft group (backend/raft) serving the processes on its host: the
// calls of their agent:// backends, the leases of the group as JSON, a
// resign call, a leader health check for load balancers and readiness
// probes, the member's view of its group, Prometheus metrics, and a status
// page with a timeline of the last hour. A Handler serves every route of
// the agent's server, and checks its one bearer token (package httpauth)
// in constant time. The read-only routes (leases, health, group, metrics,
// page) are package statusapi's, which `baton run --http` serves too; this
// package adds what only an agent serves: resign, /v1/status and the
// agent:// client calls.
//
// What it guarantees, and what not:
//
//   - Reads of the lease table (GET /v1/leases, /v1/leases/NAME,
//     /v1/health/leader, the page's table, the safe-until metric) go through
//     the raft leader, so they are linearizable: a 200 from
//     /v1/health/leader means that, at some instant during the request, a
//     client of this agent held the lease. It does not mean it still does
//     when the caller acts on the answer; a load balancer that routes on it
//     can send a request to a former leader for up to one probe interval.
//     Work that must not run twice is fenced with the term's token, not
//     routed on health checks.
//   - POST /v1/leases/NAME/resign is safe: it commits a request that the
//     holder's own Backend passes on to the holder (baton.ResignRequestTerm):
//     the holder stops its work (an Elector's callback, `baton run`'s
//     command) and then releases. The lease goes to a waiter only after the
//     holder released, or after its session expired if the holder is
//     unreachable. It never takes a lease away from a live holder behind its
//     back; a holder that ignores the request keeps the lease.
//   - The timeline and the event metrics come from the lease events this
//     member applies, kept in memory: they start when the agent starts, are
//     bounded (Options.MaxTerms, Options.MaxLeases, Options.History), and
//     are timed on this agent's clock.
//
// Read-only calls are served without a token, so that probes and
// Prometheus need no secret; they show lease names, holders, tokens and
// member IDs, never a credential. `baton agent` serves the Handler on its
// Unix socket, and only ReadOnly on TCP: a credential never travels where
// the client cannot prove the server (package agentsock). POST calls, the agent:// client calls
// that change something, and GET /v1/status need "Authorization: Bearer
// TOKEN" with Options.Token (required); POST calls are also refused from
// other origins (a web page on another site posting to a loopback agent).
package raftagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/cmd/baton/internal/statusapi"
	"github.com/batonhq/baton/internal/httpauth"
	"github.com/batonhq/baton/internal/httpjson"
)

// Source is what the handler reads and acts on: a raft group member
// (*raft.Node).
type Source interface {
	// ID returns the member's node ID; leases whose holder's session was
	// made through it are "held here".
	ID() string
	// Status returns the member's view of its group.
	Status() raft.Status
	// Determined returns nil when the member can answer who holds what.
	Determined() error
	// Leases returns the lease table, sorted by name, read through the
	// raft leader.
	Leases(ctx context.Context) ([]raft.LeaseInfo, error)
	// Lease returns one lease; an error wrapping baton.ErrNoLeader when
	// the group has no record of it.
	Lease(ctx context.Context, name string) (raft.LeaseInfo, error)
	// WatchLeases calls fn for each lease event the member applies; stop
	// ends that.
	WatchLeases(fn func(raft.LeaseEvent)) (stop func())
	// RequestResign asks the holder of name to resign, returning once the
	// request is committed.
	RequestResign(ctx context.Context, name string) error
	// ClientHandler serves the calls of agent:// clients at /v1/raft/,
	// needing token for those that change something.
	ClientHandler(token string) (http.Handler, error)
}

// Metrics are the agent's Prometheus metrics: statusapi's, the same names
// `baton run --http` serves.
type Metrics = statusapi.Metrics

// NewMetrics returns the metrics, registered in a new registry. Make them
// before the member, and give their OnRenew to raft.NodeOptions.OnRenew.
func NewMetrics() *Metrics { return statusapi.NewMetrics() }

// Options configures a Handler. The zero value means the documented
// defaults.
type Options struct {
	// Token must come as "Authorization: Bearer TOKEN" on calls that change
	// something (POST). Read-only calls never need it. Required: `baton
	// agent` uses its --http-token, or a random one it writes to a file
	// readable only by its user.
	Token string

	// Metrics are the metrics GET /metrics serves. Nil (the default) means
	// metrics of the handler's own, whose renewal metrics stay empty: to
	// fill them, make the Metrics before the member and give its OnRenew to
	// raft.NodeOptions.OnRenew.
	Metrics *Metrics

	// History is how far back the timeline reaches. Default 1 h.
	History time.Duration

	// MaxTerms bounds the terms remembered per lease. Default 500.
	MaxTerms int

	// MaxLeases bounds the leases remembered for the timeline; beyond it
	// the lease idle longest is forgotten. Default 1000.
	MaxLeases int

	// ReadTimeout bounds each read of the lease table: per request, and
	// per scrape for the safe-until metric. Default 2 s.
	ReadTimeout time.Duration

	// MaxResignWait caps the ?wait= of POST /v1/leases/NAME/resign.
	// Default 1 min.
	MaxResignWait time.Duration

	// Refresh is how often the status page refreshes itself. Default 2 s.
	Refresh time.Duration

	// Logger receives log lines (group "http"). Nil (the default) means
	// silent.
	Logger *slog.Logger

	// now is the clock (tests).
	now func() time.Time
}

// DefaultResignWait is how long POST /v1/leases/NAME/resign waits for the
// holder to release when the request has no ?wait=.
const DefaultResignWait = 10 * time.Second

func (o *Options) fill() error {
	var problems []string
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 2 * time.Second
	}
	if o.MaxResignWait == 0 {
		o.MaxResignWait = time.Minute
	}
	if o.MaxResignWait < 0 {
		problems = append(problems, "MaxResignWait must not be negative")
	}
	if o.Token == "" {
		problems = append(problems, "Token is empty: calls that change something must need a credential")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if len(problems) > 0 {
		return fmt.Errorf("raftagent: %s", strings.Join(problems, "; "))
	}
	return nil
}

// Handler serves the agent's HTTP API: every route of the agent's server.
// It answers 404 for paths it does not serve. Close it
// when done. Safe for concurrent use.
type Handler struct {
	src  Source
	opts Options
	auth *httpauth.Bearer
	log  *slog.Logger
	st   *statusapi.Handler
	mux  *http.ServeMux

	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
}

var _ Source = (*raft.Node)(nil)

// New returns a Handler of src's leases. It starts following the lease
// events at once, and reads the lease table in the background (retrying
// until it succeeds) for the terms that began before.
func New(src Source, opts Options) (*Handler, error) {
	if src == nil {
		return nil, errors.New("raftagent: Source is nil: pass the agent's *raft.Node")
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	auth, err := httpauth.NewBearer(opts.Token)
	if err != nil {
		return nil, err
	}
	clients, err := src.ClientHandler(opts.Token)
	if err != nil {
		return nil, err
	}
	st, err := statusapi.New(NodeSource{src}, statusapi.Options{
		Kind: "agent", Here: "a client of this agent", Resign: true, Metrics: opts.Metrics,
		History: opts.History, MaxTerms: opts.MaxTerms, MaxLeases: opts.MaxLeases, ReadTimeout: opts.ReadTimeout,
		Refresh: opts.Refresh, Logger: opts.Logger, Now: opts.now,
	})
	if err != nil {
		return nil, errors.New(strings.Replace(err.Error(), "statusapi: ", "raftagent: ", 1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Handler{src: src, opts: opts, auth: auth, log: opts.Logger.WithGroup("http"), st: st, ctx: ctx, cancel: cancel}
	mux := http.NewServeMux()
	st.Register(mux)
	mux.Handle("POST /v1/leases/{name}/resign", h.mutating(http.HandlerFunc(h.serveResign)))
	mux.Handle("GET /v1/status", h.auth.Require(http.HandlerFunc(h.serveStatus), h.denyToken))
	mux.Handle("/v1/raft/", clients)
	h.mux = mux
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// ReadOnly returns the handler of the agent's TCP address: the read-only
// routes (the status page, the lease table, the health check, the group,
// the metrics, and the open reads of agent:// clients, among them POST
// /v1/raft/read, which reads many leases, and POST /v1/raft/held, a client's
// long-poll for the leases it holds, which change nothing), with no
// route that takes a credential. Every other request, and any request that
// carries an Authorization header, gets 403 with a message naming socket, the Unix
// socket where the agent takes those calls. Over TCP nothing proves to a
// client that the agent answers (a process of any user can bind the port
// of an agent that crashed), so the agent takes no credential there: a
// client sending one would learn to send it to whoever holds the port.
func (h *Handler) ReadOnly(socket string) http.Handler {
	deny := func(w http.ResponseWriter, r *http.Request) {
		httpjson.Error(w, http.StatusForbidden, fmt.Sprintf("%s %s: the agent takes calls that carry its token only on its Unix socket, where clients can prove that they reach the agent, never over TCP: curl --unix-socket %s -H \"Authorization: Bearer $TOKEN\" http://agent%s (or agent://%s for baton)",
			r.Method, r.URL.Path, socket, r.URL.RequestURI(), socket))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		read := r.Method == http.MethodGet || r.Method == http.MethodHead ||
			r.Method == http.MethodPost && (r.URL.Path == "/v1/raft/read" || r.URL.Path == "/v1/raft/held")
		if !read || r.Header.Get("Authorization") != "" ||
			r.URL.Path == "/v1/status" || strings.HasPrefix(r.URL.Path, "/v1/raft/client/") {
			deny(w, r)
			return
		}
		h.mux.ServeHTTP(w, r)
	})
}

// Close stops following the lease events and waits for the handler's
// goroutines. Requests in flight may still complete; serve no more.
func (h *Handler) Close() {
	h.closeOnce.Do(func() {
		h.cancel()
		h.st.Close()
	})
}

// mutating guards calls that change something: the bearer token, and no
// cross-origin browser requests, so that a page on another site cannot make
// a browser post to a loopback agent.
func (h *Handler) mutating(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpjson.Error(w, http.StatusForbidden, "cross-origin request refused: call the agent's API from a program (curl, a script), not from a web page on another origin")
	}))
	return cop.Handler(h.auth.Require(next, h.denyToken))
}

// denyToken answers a call that lacks the agent's token.
func (h *Handler) denyToken(w http.ResponseWriter, _ *http.Request) {
	httpjson.Error(w, http.StatusUnauthorized, "this call needs the agent's token: Authorization: Bearer TOKEN (the agent's --http-token, or the token file it writes at start; see --http-token-file)")
}

// serveStatus answers GET /v1/status: the member's view of its group.
func (h *Handler) serveStatus(w http.ResponseWriter, _ *http.Request) {
	httpjson.Write(w, http.StatusOK, h.src.Status())
}
