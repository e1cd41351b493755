package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/batonhq/baton/cmd/baton/internal/raftagent"
	"github.com/batonhq/baton/internal/agentsock"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const agentLong = `Run a raft member as a long-lived sidecar, and serve its HTTP API.

An agent is a member of the group (the same --bind, --join, --tls-* and secret
as baton run --backend raft://) that campaigns for nothing itself. Processes
on the same host campaign through it with --backend agent://127.0.0.1:8790:
several commands (and baton is-leader / baton leader checks) share one
member, and the commands come and go without the group's membership changing.

An agent is never a second voter for its host: where a 'baton run' of the
same address already votes, the agent replicates without voting once
another host can vote in its place (see docs/guarantees.md).

When to use which: a service with one leader-only job per instance runs
baton run --backend raft:// (no sidecar to deploy; the instance is the
member). Hosts that run several jobs, or short-lived checks, run one baton
agent and point them at agent://.

Credentials. Calls that carry credentials go only to the agent's Unix
socket, --socket (default: $XDG_RUNTIME_DIR/baton/agent-HOST-PORT.sock;
/run/baton/agent-HOST-PORT.sock for root; else ~/.cache/baton/..., HOST:PORT
being --http's, so that agents on one port of two addresses keep apart). Its
directory must be writable by the agent's user alone; a client checks that,
and that the process serving the socket runs as that user or root
(SO_PEERCRED), before it sends anything: a process of another user that
takes the port of an agent that crashed gets no credential. --http (TCP)
serves only the read-only calls, and answers 403 to any other, naming the
socket. An agent takes no token over TCP: --http-token with a --http that is
not loopback is refused (exit 2), as the token would cross the network in
cleartext; hosts that campaign run a member (--backend raft://).

Every call that changes something needs the agent's token, as
"Authorization: Bearer TOKEN": --http-token (BATON_HTTP_TOKEN) if given, else
a random one the agent makes at start. Either way the agent writes it to
--http-token-file, mode 0600 (default: the socket's path with .token for
.sock), and removes its socket and token file when it stops, if they are
still its own. Local clients find both there: --backend agent://HOST:PORT
(the agent's socket, and the token beside it, read again when a restarted
agent wrote a new one) or agent:///PATH/TO/SOCKET, and curl --unix-socket
SOCKET -H "Authorization: Bearer $(cat TOKEN-FILE)" http://agent/PATH.
Other users need BATON_HTTP_TOKEN or BATON_HTTP_TOKEN_FILE. agent:// at
another host's address reads only, over TCP. Each agent:// session also has a secret of its own,
known only to the client that created it: with the token but without that
secret, a process cannot renew, release or destroy another client's session.
Sessions expire only by the raft leader's timers, and a client never lets
the agent's replies stretch its terms past its own TTL from its own send
time.

Resign. POST /v1/leases/NAME/resign asks the holder to resign; it does not
take the lease away. The holder learns of it at its next renewal, stops its
work (baton run: CMD gets SIGTERM, and SIGKILL after --grace), and then
releases, so the lease goes to a waiter only after the work has stopped. A
holder that cannot be reached keeps the lease until its session expires.

HTTP API (all of it on --socket; the calls without "(token)" also on
--http, loopback by default). Read-only calls need no token, so that probes
and Prometheus work; they show no credentials:
  GET  /                        status page: the group, the leases, their
                                holders and tokens, and a timeline of the
                                last hour (?window=5m zooms in)
  GET  /v1/leases               the lease table (JSON): name, holder, token (a
                                decimal string: tokens exceed 2^53),
                                since, safe_until, member, held_here, waiters
  GET  /v1/leases/NAME          one lease; 404 when nobody holds or waits for it
  POST /v1/leases/NAME/resign   ask the holder to resign (token); it stops
                                its work, then releases, and a waiter takes
                                over. Waits ?wait=DURATION (default 10s, at
                                most 1m): 200 released, 202 requested but not
                                yet released, 404 no holder, 401 no token
  GET  /v1/health/leader?lease=NAME
                                200 a client of this agent holds NAME,
                                429 another process holds it (standby),
                                503 undetermined (no quorum, nobody holds it,
                                or the read failed); HEAD too. Without
                                ?lease: the group's only lease (400 if several).
                                ?standbyok=true: 429 becomes 200
  GET  /metrics                 Prometheus metrics: baton_is_leader,
                                baton_transitions_total, term duration, renew
                                latency, safe-until margin, campaign wait
  GET  /v1/group                this member's view of the group: member IDs,
                                voters, raft leader (JSON; no addresses). A
                                run's member ID is its --id, an agent's
                                HOST-agent, then -RANDOM
  GET  /v1/status               this member's view of the group (JSON; token)
  POST /v1/raft/client/...      the calls of agent:// clients about their
                                own sessions (token and the session's secret)
  GET  /v1/raft/lease, /v1/raft/state
  POST /v1/raft/read, /v1/raft/held
                                the reads of agent:// clients (the first reads
                                many leases at once, the second waits until a
                                lease a client holds goes to another term;
                                neither changes anything)

` + awsHelp + `Exit statuses: 0 stopped by SIGTERM/SIGINT (or the instance leaving, with
--aws); 1 runtime error (--http in use; the socket cannot be made: its
directory is writable by others, or another agent serves it); 2 bad flags
(also --http-token with a --http that is not loopback).`

type agentCommand struct {
	app       *App
	http      string
	httpToken string
	tokenFile string
	socket    string
	logLevel  string
	raft      raftFlags
	aws       awsFlags
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
	c.fs.StringVar(&c.http, "http", "127.0.0.1:8790", "address of the read-only HTTP API: status page, leases, health, metrics (calls that need the token go to --socket)")
	c.fs.StringVar(&c.socket, "socket", "", "Unix socket of the full API, where agent:// clients and calls that need the token go (default: $XDG_RUNTIME_DIR/baton/agent-HOST-PORT.sock; /run/baton/... for root; else ~/.cache/baton/..., HOST:PORT being --http's)")
	c.fs.StringVar(&c.httpToken, "http-token", "", "bearer token that agent:// clients, /v1/status and POST calls must send on --socket (default: a random one, written to --http-token-file; prefer BATON_HTTP_TOKEN to the flag)")
	c.fs.StringVar(&c.tokenFile, "http-token-file", "", "file the agent writes its token to (mode 0600) for local clients, removed at exit (default: the socket's path with .token for .sock)")
	c.fs.StringVar(&c.logLevel, "log-level", "info", "log level on stderr: debug, info, warn or error")
	withEnv(c.fs, "http", "socket", "http-token", "http-token-file", "log-level")
	c.raft.register(c.fs)
	c.aws.register(c.fs)
	return cmd
}

// Run runs the member until ctx ends, then leaves the group.
func (c *agentCommand) Run(ctx context.Context) error {
	problems := append(c.raft.validate(), c.aws.validate()...)
	switch {
	case c.aws.tag == "":
	case flagSource(c.fs, "aws-tag") == "--aws-tag":
		problems = append(problems, "--aws-tag: an agent campaigns for nothing itself, so it would never tag its instance; give --aws-tag to the baton run or cron that holds the lease")
	default:
		// BATON_AWS_TAG, set for the run and cron of this host: not ours.
		c.aws.tag = ""
	}
	if _, _, err := net.SplitHostPort(c.http); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: want HOST:PORT, e.g. 127.0.0.1:8790", flagSource(c.fs, "http"), c.http))
	} else if host, _, _ := net.SplitHostPort(c.http); !backendurl.IsLoopback(host) && c.httpToken != "" {
		// The token would be for clients on other hosts, and it would reach
		// the agent in cleartext; the agent takes it only on its socket.
		problems = append(problems, fmt.Sprintf("%s with %s %s (not a loopback address): an agent takes its token only on its Unix socket (--socket), never over TCP, where it would cross the network in cleartext; %s serves the read-only API (status page, leases, health, metrics) to other hosts without a token. Drop %s (local clients read the generated token file beside the socket), and run a member (--backend raft://) on hosts that campaign",
			flagSource(c.fs, "http-token"), flagSource(c.fs, "http"), c.http, flagSource(c.fs, "http"), flagSource(c.fs, "http-token")))
	}
	if c.socket != "" && !filepath.IsAbs(c.socket) {
		problems = append(problems, fmt.Sprintf("%s %q: want an absolute path, e.g. /run/baton/agent.sock", flagSource(c.fs, "socket"), c.socket))
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(c.fs, "log-level"), c.logLevel, err))
	}
	if err := problemsError(problems); err != nil {
		return err
	}
	lvl, _ := parseLevel(c.logLevel)
	log := newLogger(c.app.stderr(), lvl)
	if host, err := c.app.hostname(); err == nil && host != "" {
		c.raft.name = host + "-agent" // the member's ID: HOST-agent-RANDOM
	} else {
		c.raft.name = "agent"
	}
	// --aws: leave the group as on SIGTERM when the instance is leaving,
	// then complete the lifecycle action.
	ctx, inst, err := c.aws.startAWS(ctx, c.raft.join, log)
	if err != nil {
		return err
	}
	defer inst.finish(ctx)
	opts, err := c.raft.nodeOptions(ctx, log)
	if err != nil {
		return err
	}
	// Made before the member, which reports its renewals to them.
	metrics := raftagent.NewMetrics()
	if err := inst.register(metrics.Registry()); err != nil {
		return err
	}
	opts.OnRenew = metrics.OnRenew
	ln, err := net.Listen("tcp", c.http)
	if err != nil {
		return &exitError{code: exitFailure, err: fmt.Errorf("--http %s: %w", c.http, err)}
	}
	socketPath := c.socket
	if socketPath == "" {
		host, port, _ := net.SplitHostPort(ln.Addr().String())
		if socketPath, err = defaultAgentSocket(c.app.lookupEnv, host, port); err != nil {
			ln.Close()
			return &exitError{code: exitUsage, err: err}
		}
	}
	sock, err := agentsock.Listen(socketPath)
	if err != nil {
		ln.Close()
		return &exitError{code: exitFailure, err: fmt.Errorf("--socket %s (choose another with --socket): %w", socketPath, err)}
	}
	token, removeToken, err := c.token(sock.Path(), log)
	if err != nil {
		ln.Close()
		sock.Close()
		return err
	}
	defer removeToken()
	n, err := startMember(ctx, opts, log)
	if err != nil {
		ln.Close()
		sock.Close()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	api, err := raftagent.New(n, raftagent.Options{Token: token, Metrics: metrics, Logger: log})
	if err != nil {
		ln.Close()
		sock.Close()
		return errors.Join(err, closeWithin(ctx, 10*time.Second, "the raft member", log, n.Close))
	}
	// TCP serves what needs no credential; the socket, whose server its
	// clients can prove (package agentsock), serves everything.
	srv := &http.Server{Handler: api.ReadOnly(sock.Path()), ReadHeaderTimeout: 5 * time.Second}
	ssrv := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	go func() { served <- ssrv.Serve(sock) }()
	log.Info("agent serving", "http", ln.Addr().String(), "socket", sock.Path(), "member", n.ID(), "addr", n.Addr())
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
	_ = ssrv.Shutdown(sctx)
	sock.Close()
	api.Close()
	if err := closeWithin(ctx, 10*time.Second, "the raft member", log, n.Close); err != nil {
		log.Warn("leaving the group", "err", err)
	}
	log.Info("agent stopped")
	return runErr
}

// token returns the agent's token — --http-token, or a new random one — and
// writes it to the token file for local clients (for an agent serving its
// socket at socket: beside it, by default). remove deletes the file again
// if it is still the one written here (another agent may have written its
// own there since). Without --http-token a token file that cannot be
// written is an error, since no client could learn the token; with it, a
// warning.
func (c *agentCommand) token(socket string, log *slog.Logger) (token string, remove func(), err error) {
	token = c.httpToken
	generated := token == ""
	if generated {
		token = newAgentToken()
	}
	path := c.tokenFile
	if path == "" {
		path = agentTokenFileOf(socket)
	}
	written, err := writeAgentToken(path, token)
	if err != nil {
		err = fmt.Errorf("writing the agent's token file (set its place with --http-token-file, or give a token with --http-token): %w", err)
		if generated {
			return "", nil, &exitError{code: exitFailure, err: err}
		}
		log.Warn("local clients will need the token given to them", "err", err)
		return token, func() {}, nil
	}
	log.Info("agent token written for local clients", "file", path, "generated", generated)
	return token, func() {
		if st, err := os.Lstat(path); err == nil && os.SameFile(st, written) {
			_ = os.Remove(path)
		}
	}, nil
}
