package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/batonhq/baton/cmd/baton/internal/raftagent"
	"github.com/batonhq/baton/cmd/baton/internal/statusapi"
	"github.com/batonhq/baton/internal/httpjson"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
)

// httpHelp is the part of run's and cron's help about --http.
const httpHelp = `HTTP (--http ADDR; no server without it): a read-only API for readiness
probes, Prometheus and people, on every backend:
  GET /v1/health/leader   200 this process leads (its term has not ended and
                          is before its safe-until), 429 another process
                          holds the lease (standby), 503 undetermined: not
                          connected to the backend yet, the backend did not
                          answer within 2s, nobody holds the lease, this
                          process's term just ended or is just beginning, it
                          is stopping, or (raft://) the member hears from no
                          raft leader; HEAD too. JSON: status (leader,
                          standby, undetermined), holder, token, reason.
                          ?standbyok=true: a standby answers 200 too, for
                          a readiness probe that means "healthy"
  GET /v1/leases/NAME     the lease (JSON): holder, token (a decimal string),
                          since, safe_until (when held here), held_here; 404
                          for another lease than --lease
  GET /metrics            Prometheus metrics with the names baton agent
                          serves: baton_is_leader, baton_transitions_total,
                          term duration, campaign wait, safe-until margin,
                          and (raft:// only) renewal latency and errors
  GET /                   status page: the lease, its holder and token, and a
                          timeline of the terms seen in the last hour
  GET /v1/group           raft:// only: the group as this member sees it
                          (member IDs, voters, raft leader)
  GET /v1/raft/lease, /v1/raft/state, POST /v1/raft/read, /v1/raft/held
                          raft:// only: the reads of agent:// clients (the
                          POSTs read many leases at once), so that is-leader
                          and leader --backend agent://ADDR read through
                          this member as through an agent
ADDR is PORT or HOST:PORT. A port alone (8080 or :8080) listens on loopback,
127.0.0.1; to be reached from elsewhere, name the host: 0.0.0.0:8080 for a
Kubernetes readiness probe. No route needs a token, none changes anything,
and none shows a credential. A 200 is true when it is sent: a load balancer
may route to a former leader for up to one probe interval, so fence writes
with BATON_TOKEN. A port already in use is a runtime error (exit 1).

`

// httpFlag is --http of run and cron: the read-only status API of package
// statusapi (health, lease, metrics, status page), for any backend.
//
// Where it listens: a port alone ("8080" or ":8080") means loopback,
// 127.0.0.1:PORT, so that nothing is reachable from other hosts unless the
// operator names a host; "0.0.0.0:8080" (what a Kubernetes readiness probe,
// which dials the pod's IP, needs) or any other HOST:PORT is taken as
// given. No token: every route is a read that shows lease names, holders
// and tokens, never a credential, and the server has no route that changes
// anything (resign is the agent's, behind its token). Not read from
// BATON_HTTP, which is the agent's address on the same host.
type httpFlag struct {
	addr string
	kind string // run or cron, for the page
	fs   *pflag.FlagSet
}

func (h *httpFlag) register(fs *pflag.FlagSet, kind string) {
	h.fs, h.kind = fs, kind
	fs.StringVar(&h.addr, "http", "", "serve GET /v1/health/leader (200 leader, 429 standby, 503 undetermined), /v1/leases/NAME, /metrics and a status page on this address; a port alone (8080 or :8080) is loopback, 127.0.0.1:PORT; name a host to serve others, e.g. 0.0.0.0:8080 for Kubernetes probes (default: no HTTP server)")
}

// listenAddr returns the address to listen on, or why --http is not one.
func (h *httpFlag) listenAddr() (string, error) {
	a := h.addr
	if !strings.Contains(a, ":") {
		a = ":" + a
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("--http %q: want PORT or HOST:PORT, e.g. 8080 (loopback) or 0.0.0.0:8080", h.addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("--http %q: port %q is not a number from 0 to 65535 (0 picks a free port)", h.addr, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// validate returns the problem with --http, if any.
func (h *httpFlag) validate() []string {
	if h.addr == "" {
		return nil
	}
	if _, err := h.listenAddr(); err != nil {
		return []string{err.Error()}
	}
	return nil
}

// httpServer is the --http server of one run or cron. A nil *httpServer
// (no --http) does nothing.
type httpServer struct {
	src *statusapi.ElectorSource
	api *statusapi.Handler
	// reads serves /v1/raft/: the reads of agent:// clients (is-leader,
	// leader) from a raft:// member; nil until attach, and for any other
	// backend.
	reads    atomic.Pointer[http.Handler]
	backend  string // the backend URL, redacted, for messages
	attached atomic.Bool
	srv      *http.Server
	served   chan struct{}
	log      *slog.Logger
	reg      prometheus.Registerer // the metrics' registry, for more collectors
}

// start listens on --http and serves the campaign of candidate id for
// lease, undetermined until attach; nil without --http. A raft member made
// from member reports its renewals to the server's metrics. A listen that
// fails is a runtime error (exit 1): the port is taken, or the host is
// not this machine's.
func (h *httpFlag) start(lease, id, backend string, member *raftFlags, log *slog.Logger) (*httpServer, error) {
	if h.addr == "" {
		return nil, nil
	}
	addr, err := h.listenAddr()
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", h.addr, err)
	}
	src := statusapi.NewElectorSource(lease, id)
	metrics := statusapi.NewMetrics()
	api, err := statusapi.New(src, statusapi.Options{Kind: h.kind, Here: "this process", Backend: redactURL(backend), Metrics: metrics, Logger: log})
	if err != nil {
		ln.Close()
		src.Close()
		return nil, err
	}
	s := &httpServer{src: src, api: api, served: make(chan struct{}), log: log.WithGroup("http"), reg: metrics.Registry(), backend: redactURL(backend)}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.HandleFunc("/v1/raft/", s.serveRaftReads)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("HTTP server stopped", "err", err)
		}
	}()
	member.onRenew = metrics.OnRenew
	s.log.Info("serving HTTP", "addr", ln.Addr().String(), "health", "http://"+ln.Addr().String()+"/v1/health/leader")
	return s, nil
}

// hooks makes cfg's Elector report its terms to the server.
func (s *httpServer) hooks(cfg *baton.ElectorConfig) {
	if s != nil {
		s.src.Hooks(cfg)
	}
}

// attach gives the server the open backend and its Elector.
func (s *httpServer) attach(b *backendurl.Backend, e *baton.Elector) {
	if s == nil {
		return
	}
	var member statusapi.RaftMember
	if b.Node != nil {
		member = raftagent.NodeSource{Source: b.Node}
		reads := b.Node.ReadHandler()
		s.reads.Store(&reads)
	}
	s.attached.Store(true)
	s.src.Attach(b.Backend, e, member)
}

// serveRaftReads serves the reads of agent:// clients — what `baton
// is-leader` and `baton leader` ask with --backend agent://ADDR, ADDR being
// this --http — from this process's raft member, as an agent serves them.
// Until the member is in its group the answer is 503, which such a client
// retries until its --timeout.
func (s *httpServer) serveRaftReads(w http.ResponseWriter, r *http.Request) {
	if h := s.reads.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if !s.attached.Load() {
		httpjson.Error(w, http.StatusServiceUnavailable, "this process is not connected to its backend yet")
		return
	}
	httpjson.Error(w, http.StatusNotFound, fmt.Sprintf(
		"this baton process is not a member of a raft group (its backend is %s), so agent:// cannot read through it: ask its backend, e.g. baton is-leader --backend %s, or read GET /v1/leases/NAME here",
		s.backend, s.backend))
}

// close stops serving, waiting a little for requests in flight.
func (s *httpServer) close() {
	if s == nil {
		return
	}
	s.src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.served
	s.api.Close()
}
