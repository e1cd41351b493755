package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
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

// parseAgentURL accepts agent://[TOKEN@]HOST:PORT, a raft agent (`baton
// agent`).
func parseAgentURL(u *url.URL) (opener, error) {
	const form = "agent://HOST:PORT (the HTTP address of a raft agent, e.g. agent://127.0.0.1:8790)"
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("agent URLs take no path or query: use %s", form)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return nil, fmt.Errorf("agent address %q is not HOST:PORT: use %s", u.Host, form)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("agent port %q is not a number from 1 to 65535: use %s", port, form)
	}
	token := ""
	if u.User != nil {
		token = u.User.Username()
	}
	return func(_ context.Context, o Options) (*Backend, error) {
		copts := raft.ClientOptions{Token: token}
		if token == "" && o.AgentClient != nil {
			copts = o.AgentClient(host, port)
		}
		c, err := raft.Dial(u.Host, copts)
		if err != nil {
			return nil, err
		}
		b, err := raft.New(c, raft.Options{Config: backend.Config{TTL: o.TTL}, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		return &Backend{Backend: b, close: b.Close}, nil
	}, nil
}

// raftWindow is the renewal window of a raft holder at ttl (0: the
// backend's default).
func raftWindow(ttl time.Duration) (time.Duration, error) {
	return raft.Options{Config: backend.Config{TTL: ttl}}.RenewalWindow()
}
