package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/backendurl"
)

// openBackend opens the backend of spec for a command: with raft, this
// process's member from those flags (nil for commands that cannot run a
// member); agent:// finds the agent's token in the environment or the
// agent's token file. Errors in what the user gave are usage errors.
func (a *App) openBackend(ctx context.Context, spec *backendurl.Spec, ttl time.Duration, log *slog.Logger, member *raftFlags) (*backendurl.Backend, error) {
	o := backendurl.Options{TTL: ttl, Logger: log, AgentClient: a.agentClient(log)}
	if member != nil {
		o.Member = func(ctx context.Context) (*raft.Node, error) {
			opts, err := member.nodeOptions(log)
			if err != nil {
				return nil, err
			}
			opts.OnRenew = member.onRenew
			return startMember(ctx, opts, log)
		}
	}
	b, err := spec.Open(ctx, o)
	var se *backendurl.SettingsError
	if errors.As(err, &se) {
		return nil, &exitError{code: exitUsage, err: err}
	}
	return b, err
}

// agentClient returns the client options of an agent:// URL that names no
// token: BATON_HTTP_TOKEN, or else the agent's token file, read again
// whenever the agent refuses the token (an agent writes a new one at every
// start). The default token file belongs to the agent on this host: it is
// never sent to another one (BATON_HTTP_TOKEN_FILE is, if given).
func (a *App) agentClient(log *slog.Logger) func(host, port string) raft.ClientOptions {
	return func(host, port string) raft.ClientOptions {
		token, _ := a.lookupEnv("BATON_HTTP_TOKEN")
		copts := raft.ClientOptions{Token: token}
		if file, _ := a.lookupEnv("BATON_HTTP_TOKEN_FILE"); token == "" && (isLoopback(host) || file != "") {
			copts.TokenSource = func() (string, error) { return agentClientToken(a.lookupEnv, port, log) }
		}
		return copts
	}
}
