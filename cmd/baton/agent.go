package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/batonhq/baton/internal/agenthttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const agentLong = `Run a raft member as a long-lived sidecar, and serve its HTTP API.

An agent is a member of the group (the same --bind, --join, --tls-* and secret
as baton run --backend raft://) that campaigns for nothing itself. Processes
on the same host campaign through it with --backend agent://127.0.0.1:8790:
several commands (and baton is-leader / baton leader checks) share one
member, and the commands come and go without the group's membership changing.

When to use which: a service with one leader-only job per instance runs
baton run --backend raft:// (no sidecar to deploy; the instance is the
member). Hosts that run several jobs, or short-lived checks, run one baton
agent and point them at agent://.

HTTP API (on --http, loopback by default). Read-only calls need no token,
so that probes and Prometheus work; the others need "Authorization: Bearer
TOKEN" when --http-token is set:
  GET  /                        status page: the group, the leases, their
                                holders and tokens, and a timeline of the
                                last hour (?window=5m zooms in)
  GET  /v1/leases               the lease table (JSON): name, holder, token,
                                since, safe_until, member, held_here, waiters
  GET  /v1/leases/NAME          one lease; 404 when nobody holds or waits for it
  POST /v1/leases/NAME/resign   ask the holder to resign (token); it ends its
                                term at its next renewal and a waiter takes
                                over. Waits ?wait=DURATION (default 10s, at
                                most 1m): 200 released, 202 requested but not
                                yet released, 404 no holder, 401 no token
  GET  /v1/health/leader?lease=NAME
                                200 a client of this agent holds NAME,
                                429 another process holds it (standby),
                                503 undetermined (no quorum, nobody holds it,
                                or the read failed); HEAD too. Without
                                ?lease: the group's only lease (400 if several)
  GET  /metrics                 Prometheus metrics: baton_is_leader,
                                baton_transitions_total, term duration, renew
                                latency, safe-until margin, campaign wait
  GET  /v1/status               this member's view of the group (JSON; token)
  POST /v1/raft/...             the calls of agent:// clients (token)

Exit statuses: 0 stopped by SIGTERM/SIGINT; 1 runtime error; 2 bad flags.`

type agentCommand struct {
	app       *App
	http      string
	httpToken string
	logLevel  string
	raft      raftFlags
	fs        *pflag.FlagSet
}

func (a *App) newAgentCommand() *cobra.Command {
	c := &agentCommand{app: a}
	cmd := &cobra.Command{
		Use:   "agent [flags]",
		Short: "Run a raft member as a sidecar for agent:// clients",
		Long:  agentLong,
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, args []string) error { return c.Run(cmd.Context()) }),
	}
	c.fs = cmd.Flags()
	c.fs.StringVar(&c.http, "http", "127.0.0.1:8790", "address of the HTTP API (keep it on loopback unless --http-token is set)")
	c.fs.StringVar(&c.httpToken, "http-token", "", "bearer token that agent:// clients, /v1/status and POST calls must send; read-only GETs and /metrics need none (prefer BATON_HTTP_TOKEN)")
	c.fs.StringVar(&c.logLevel, "log-level", "info", "log level on stderr: debug, info, warn or error")
	withEnv(c.fs, "http", "http-token", "log-level")
	c.raft.register(c.fs)
	return cmd
}

// Run runs the member until ctx ends, then leaves the group.
func (c *agentCommand) Run(ctx context.Context) error {
	problems := c.raft.validate()
	if _, _, err := net.SplitHostPort(c.http); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: want HOST:PORT, e.g. 127.0.0.1:8790", flagSource(c.fs, "http"), c.http))
	} else if host, _, _ := net.SplitHostPort(c.http); !isLoopback(host) && c.httpToken == "" {
		problems = append(problems, fmt.Sprintf("%s %s is not a loopback address: set --http-token (BATON_HTTP_TOKEN) so that other hosts cannot campaign through this agent", flagSource(c.fs, "http"), c.http))
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(c.fs, "log-level"), c.logLevel, err))
	}
	if err := problemsError(problems); err != nil {
		return err
	}
	lvl, _ := parseLevel(c.logLevel)
	log := newLogger(c.app.stderr(), lvl)
	opts, err := c.raft.nodeOptions(log)
	if err != nil {
		return err
	}
	// Made before the member, which reports its renewals to them.
	metrics := agenthttp.NewMetrics()
	opts.OnRenew = metrics.OnRenew
	ln, err := net.Listen("tcp", c.http)
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("--http %s: %w", c.http, err)}
	}
	n, err := startMember(ctx, opts, log)
	if err != nil {
		ln.Close()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	api, err := agenthttp.New(n, agenthttp.Options{Token: c.httpToken, Metrics: metrics, Logger: log})
	if err != nil {
		ln.Close()
		return errors.Join(err, closeWithin(ctx, 10*time.Second, "the raft member", log, n.Close))
	}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.Handle("/v1/raft/", n.ClientHandler(c.httpToken))
	mux.Handle("GET /v1/status", bearerOptional(c.httpToken, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Status())
	})))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("agent serving", "http", ln.Addr().String(), "member", n.ID(), "addr", n.Addr())
	var runErr error
	select {
	case <-ctx.Done():
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("HTTP API: %w", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	api.Close()
	if err := closeWithin(ctx, 10*time.Second, "the raft member", log, n.Close); err != nil {
		log.Warn("leaving the group", "err", err)
	}
	log.Info("agent stopped")
	return runErr
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// bearerOptional requires "Authorization: Bearer token" when token is set,
// comparing digests in constant time.
func bearerOptional(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := sha256.Sum256([]byte("Bearer " + token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="baton agent"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
