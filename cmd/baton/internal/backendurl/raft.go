package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strconv"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/raft"
)

// ErrNoMember is the error of opening raft:// without Options.Member.
var ErrNoMember = errors.New("backendurl: raft:// makes this process a member of the group, and Options.Member is nil")

// parseRaftURL accepts raft:// alone: a member's settings are not a URL's.
func parseRaftURL(u *url.URL) (opener, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, errors.New("raft URLs take nothing after the scheme: use raft://; the member's addresses, peers, TLS files and secret are set apart from the URL")
	}
	return func(ctx context.Context, o Options) (*Backend, error) {
		if o.Member == nil {
			return nil, &SettingsError{Err: ErrNoMember}
		}
		n, err := o.Member(ctx)
		if err != nil {
			return nil, err
		}
		b, err := raft.New(n, raft.Options{Config: backend.Config{TTL: o.TTL}, Logger: o.Logger})
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.CloseTimeout)
			defer cancel()
			_ = n.Close(cctx)
			return nil, &SettingsError{Err: err}
		}
		return &Backend{Backend: b, Node: n, close: func(ctx context.Context) error {
			// The session first, so its leases are released at once; then
			// the member hands raft leadership on and leaves.
			return errors.Join(b.Close(ctx), n.Close(ctx))
		}}, nil
	}, nil
}

// parseAgentURL accepts agent://[TOKEN@]/PATH, a raft agent's (`baton
// agent`) Unix socket, and agent://[TOKEN@]HOST:PORT, its HTTP address,
// which Options.AgentClient maps to the socket of the agent at that
// address on this host. A token in the URL is refused for any host but
// loopback: over the network it would travel in cleartext to whatever
// answers.
func parseAgentURL(u *url.URL) (opener, error) {
	const form = "agent:///PATH (the Unix socket of a raft agent, e.g. agent:///run/baton/agent-127.0.0.1-8790.sock) or agent://HOST:PORT (its HTTP address, e.g. agent://127.0.0.1:8790)"
	if u.RawQuery != "" {
		return nil, fmt.Errorf("agent URLs take no query: use %s", form)
	}
	token := ""
	if u.User != nil {
		token = u.User.Username()
	}
	socket, addr := "", u.Host
	if u.Host == "" {
		if u.Path == "" || u.Path == "/" || path.Clean(u.Path) != u.Path {
			return nil, fmt.Errorf("agent socket %q: want an absolute, clean path: use %s", u.Path, form)
		}
		socket = u.Path
	} else {
		if u.Path != "" && u.Path != "/" {
			return nil, fmt.Errorf("agent://HOST:PORT takes no path: use %s", form)
		}
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || host == "" {
			return nil, fmt.Errorf("agent address %q is not HOST:PORT: use %s", u.Host, form)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("agent port %q is not a number from 1 to 65535: use %s", port, form)
		}
		if token != "" && !IsLoopback(host) {
			return nil, fmt.Errorf("agent://TOKEN@%s would send the agent's token in cleartext over the network to whatever answers there: an agent takes its token only on its Unix socket; run the client on the agent's host (agent:///PATH or agent://127.0.0.1:PORT), or make this host a member of the group (raft://)", u.Host)
		}
	}
	return func(_ context.Context, o Options) (*Backend, error) {
		dial, copts := socket, raft.ClientOptions{Token: token}
		if dial == "" {
			dial = addr
		}
		if o.AgentClient != nil {
			var err error
			if dial, copts, err = o.AgentClient(addr, socket, token); err != nil {
				return nil, &SettingsError{Err: err}
			}
		}
		c, err := raft.Dial(dial, copts)
		if err != nil {
			return nil, &SettingsError{Err: err}
		}
		b, err := raft.New(c, raft.Options{Config: backend.Config{TTL: o.TTL}, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		return &Backend{Backend: b, close: b.Close}, nil
	}, nil
}

// IsLoopback reports whether host is "localhost" or a loopback IP address.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// raftWindow is the renewal window of a raft holder at ttl (0: the
// backend's default).
func raftWindow(ttl time.Duration) (time.Duration, error) {
	return raft.Options{Config: backend.Config{TTL: ttl}}.RenewalWindow()
}
