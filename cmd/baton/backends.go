package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
)

// openBackend opens the backend of spec for a command: with raft, this
// process's member from those flags (nil for commands that cannot run a
// member); agent:// finds the agent's token in the environment or the
// agent's token file. Errors in what the user gave are usage errors.
func (a *App) openBackend(ctx context.Context, spec *backendurl.Spec, ttl time.Duration, log *slog.Logger, member *raftFlags) (*backendurl.Backend, error) {
	// A command without a member (is-leader, leader) only reads.
	o := backendurl.Options{TTL: ttl, Logger: log, AgentClient: a.agentClient(log, member == nil)}
	if member != nil {
		o.Member = func(ctx context.Context) (*raft.Node, error) {
			opts, err := member.nodeOptions(ctx, log)
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

// agentClient returns how an agent:// URL reaches its agent: always on
// the agent's Unix socket when this host has it (agent:///PATH, or the
// socket of the agent at HOST:PORT, see agentSocketFor), where the client
// proves the server before it sends a credential. The token is the URL's,
// else BATON_HTTP_TOKEN, else the agent's token file beside the socket
// (or BATON_HTTP_TOKEN_FILE), read again whenever the agent refuses the
// token (an agent writes a new one at every start). An agent at another
// host's address is reached over TCP, for reads only: no credential
// crosses the network in cleartext. So is, for a command that only reads
// (readOnly: is-leader, leader), an address of this host with no agent
// socket: the --http of a `baton run --backend raft://`, which serves
// those reads (and no call that takes a credential) as an agent does.
func (a *App) agentClient(log *slog.Logger, readOnly bool) func(addr, socket, token string) (string, raft.ClientOptions, error) {
	return func(addr, socket, token string) (string, raft.ClientOptions, error) {
		if token == "" {
			token, _ = a.lookupEnv("BATON_HTTP_TOKEN")
		}
		if socket == "" {
			host, port, _ := net.SplitHostPort(addr)
			p, found, err := agentSocketFor(a.lookupEnv, host, port)
			switch {
			case !found && readOnly:
				log.Debug("no agent socket for this address: reads only, over TCP (an agent, or a baton run --http)", "addr", addr)
				return addr, raft.ClientOptions{}, nil
			case found || (err == nil && backendurl.IsLoopback(host)):
				socket = p
			case err != nil && backendurl.IsLoopback(host):
				return "", raft.ClientOptions{}, fmt.Errorf("agent://%s: %w; or name the agent's socket: agent:///PATH", addr, err)
			default:
				log.Debug("agent on another host: reads only, over TCP", "agent", addr)
				return addr, raft.ClientOptions{}, nil
			}
		}
		copts := raft.ClientOptions{Token: token}
		if token == "" {
			copts.TokenSource = func() (string, error) { return agentClientToken(a.lookupEnv, socket, log) }
		}
		return socket, copts, nil
	}
}
