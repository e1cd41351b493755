package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/discovery"
	"github.com/batonhq/baton/internal/certs"
	"github.com/spf13/pflag"
)

// defaultRaftPort is the group port (raft and the member API share it).
const defaultRaftPort = 7390

// raftFlags are the settings of a raft member: `baton run --backend
// raft://` and `baton agent`.
type raftFlags struct {
	bind            string
	advertise       string
	dataDir         string
	join            string
	bootstrapExpect int
	voters          int
	witness         bool
	tlsCA           string
	tlsCert         string
	tlsKey          string
	secret          string
	secretFile      string

	fs *pflag.FlagSet
}

func (r *raftFlags) register(fs *pflag.FlagSet) {
	r.fs = fs
	fs.StringVar(&r.bind, "bind", fmt.Sprintf("0.0.0.0:%d", defaultRaftPort), "raft: address to listen on for the group (raft and member API share it)")
	fs.StringVar(&r.advertise, "advertise", "", "raft: address peers reach this member at (default: the bind address, or this host's first private IPv4 when bound to 0.0.0.0)")
	fs.StringVar(&r.dataDir, "data-dir", "", "raft: directory for the log and snapshots, kept across restarts (default: in memory; a new member at every start)")
	fs.StringVar(&r.join, "join", "", "raft: where to find peers: static:HOST[:PORT],... | dns:NAME[:PORT] | dns:_SERVICE._tcp.NAME | aws-asg[:GROUP]")
	fs.IntVar(&r.bootstrapExpect, "bootstrap-expect", 3, "raft: form a new group once this many members are seen, none in a group yet (0: only join an existing group)")
	fs.IntVar(&r.voters, "voters", 3, "raft: number of voting members (3 or 5); the others replicate without voting")
	fs.BoolVar(&r.witness, "witness", false, "raft: vote, never campaign (the third member beside two application instances)")
	fs.StringVar(&r.tlsCA, "tls-ca", "", "raft: PEM file of the group's CA (made by baton tls ca)")
	fs.StringVar(&r.tlsCert, "tls-cert", "", "raft: PEM file of this member's certificate, signed by the group's CA")
	fs.StringVar(&r.tlsKey, "tls-key", "", "raft: PEM file of this member's private key")
	fs.StringVar(&r.secret, "secret", "", "raft: the group's join secret, 16+ bytes (prefer BATON_SECRET or --secret-file: flags show in ps)")
	fs.StringVar(&r.secretFile, "secret-file", "", "raft: file holding the group's join secret")
	withEnv(fs, "bind", "advertise", "data-dir", "join", "bootstrap-expect", "voters", "witness", "tls-ca", "tls-cert", "tls-key", "secret", "secret-file")
}

// validate returns the problems with the raft flags, each saying how to fix
// it, without reading files or the network.
func (r *raftFlags) validate() []string {
	var problems []string
	if err := checkHostPort(r.bind, 0); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: %v; want HOST:PORT, e.g. 0.0.0.0:%d", flagSource(r.fs, "bind"), r.bind, err, defaultRaftPort))
	}
	if r.advertise != "" {
		if err := checkHostPort(r.advertise, 1); err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: %v; want the HOST:PORT peers reach this member at, e.g. 10.0.0.5:%d", flagSource(r.fs, "advertise"), r.advertise, err, defaultRaftPort))
		}
	}
	if r.join != "" {
		if _, err := discovery.Parse(r.join, defaultRaftPort, discovery.Options{}); err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(r.fs, "join"), r.join, err))
		}
	}
	if r.bootstrapExpect < 0 {
		problems = append(problems, fmt.Sprintf("%s %d: use 0 (join only) or the number of members to wait for", flagSource(r.fs, "bootstrap-expect"), r.bootstrapExpect))
	}
	if r.voters != 1 && r.voters != 3 && r.voters != 5 && r.voters != 7 {
		problems = append(problems, fmt.Sprintf("%s %d: use 3 or 5 (1 for a test; an even number adds no fault tolerance)", flagSource(r.fs, "voters"), r.voters))
	}
	for _, f := range []struct{ name, val string }{{"tls-ca", r.tlsCA}, {"tls-cert", r.tlsCert}, {"tls-key", r.tlsKey}} {
		if f.val == "" {
			problems = append(problems, fmt.Sprintf("--%s is required with raft: members talk over mutual TLS; `baton tls ca` and `baton tls cert` make the files (or set %s)", f.name, envName(f.name)))
		}
	}
	switch {
	case r.secret != "" && r.secretFile != "":
		problems = append(problems, "give the join secret once: --secret (BATON_SECRET) or --secret-file, not both")
	case r.secret == "" && r.secretFile == "":
		problems = append(problems, "the group's join secret is required with raft: set BATON_SECRET or --secret-file (16+ bytes, e.g. from `openssl rand -hex 16`)")
	case r.secret != "" && len(r.secret) < 16:
		problems = append(problems, fmt.Sprintf("%s is %d bytes: the join secret must be at least 16", flagSource(r.fs, "secret"), len(r.secret)))
	}
	return problems
}

// checkHostPort checks a HOST:PORT flag without resolving it: a port from
// minPort to 65535 (0 lets the kernel choose, for --bind) and a host that is
// an IP address or a host name (empty: every address, for --bind).
func checkHostPort(addr string, minPort int) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < minPort || n > 65535 {
		return fmt.Errorf("port %q is not a number from %d to 65535", port, minPort)
	}
	if host == "" {
		if minPort == 0 {
			return nil
		}
		return errors.New("no host")
	}
	return checkHost(host)
}

// nodeOptions reads the TLS files and the secret and returns the member's
// options.
func (r *raftFlags) nodeOptions(log *slog.Logger) (raft.NodeOptions, error) {
	tlsCfg, err := certs.Load(certs.Files{CA: r.tlsCA, Cert: r.tlsCert, Key: r.tlsKey})
	if err != nil {
		return raft.NodeOptions{}, &exitError{code: exitUsage, err: err}
	}
	secret := r.secret
	if r.secretFile != "" {
		b, err := os.ReadFile(r.secretFile)
		if err != nil {
			return raft.NodeOptions{}, &exitError{code: exitUsage, err: fmt.Errorf("--secret-file: %w", err)}
		}
		secret = strings.TrimSpace(string(b))
		if len(secret) < 16 {
			return raft.NodeOptions{}, &exitError{code: exitUsage, err: fmt.Errorf("--secret-file %s holds %d bytes: the join secret must be at least 16", r.secretFile, len(secret))}
		}
	}
	advertise := r.advertise
	if advertise == "" {
		host, port, _ := net.SplitHostPort(r.bind)
		if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
			priv, err := privateIPv4()
			if err != nil {
				return raft.NodeOptions{}, &exitError{code: exitUsage, err: fmt.Errorf("--bind %s listens on every address, and %v: set --advertise to the address peers reach this member at", r.bind, err)}
			}
			advertise = net.JoinHostPort(priv.String(), port)
		}
	}
	opts := raft.NodeOptions{
		DataDir:         r.dataDir,
		BindAddr:        r.bind,
		AdvertiseAddr:   advertise,
		TLS:             tlsCfg,
		Secret:          secret,
		BootstrapExpect: r.bootstrapExpect,
		Voters:          r.voters,
		Witness:         r.witness,
		Logger:          log,
	}
	if r.join != "" {
		d, err := discovery.Parse(r.join, defaultRaftPort, discovery.Options{AWS: discovery.AWSOptions{Logger: log}})
		if err != nil {
			return raft.NodeOptions{}, &exitError{code: exitUsage, err: err}
		}
		opts.Discovery = d
	}
	return opts, nil
}

// privateIPv4 returns this host's first private (RFC 1918) IPv4 address.
func privateIPv4() (netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err == nil && p.Addr().Is4() && p.Addr().IsPrivate() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, errors.New("this host has no private IPv4 address")
}

// startMember starts a member and waits until it is in a group, logging
// while it waits.
func startMember(ctx context.Context, opts raft.NodeOptions, log *slog.Logger) (*raft.Node, error) {
	n, err := raft.StartNode(opts)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "listen" {
			return nil, fmt.Errorf("%w; --bind %s must be a free port on an address of this host: stop what listens there (another member?), or choose another --bind", err, opts.BindAddr)
		}
		return nil, err
	}
	log.Info("raft member started; finding the group", "id", n.ID(), "addr", n.Addr(), "bootstrap_expect", opts.BootstrapExpect)
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-n.Joined():
			st := n.Status()
			log.Info("in the group", "leader", st.Leader, "members", len(st.Members), "voters", len(st.Voters))
			return n, nil
		case <-n.Failed():
			// Refused by a live group for the secret: retrying cannot
			// help, so this is a configuration error.
			_ = closeWithin(ctx, 5*time.Second, "the raft member", log, n.Close)
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("%w: set BATON_SECRET (or --secret-file) to the group's secret", n.Err())}
		case <-tick.C:
			log.Warn("still not in a group: check --join, the TLS files and the secret on every member", "id", n.ID())
		case <-ctx.Done():
			_ = closeWithin(ctx, 5*time.Second, "the raft member", log, n.Close)
			return nil, ctx.Err()
		}
	}
}

// parseRaftURL accepts raft:// alone: the member's settings are flags.
func parseRaftURL(u *url.URL) (opener, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, errors.New("raft URLs take nothing after the scheme: use raft:// with --bind, --join, --bootstrap-expect, --tls-* and BATON_SECRET")
	}
	return func(ctx context.Context, o backendOptions) (*openBackend, error) {
		if o.raft == nil {
			return nil, &exitError{code: exitUsage, err: errors.New("raft:// makes this process a member of the group, which only `baton run` and `baton agent` do; ask a member's agent instead: --backend agent://127.0.0.1:8790")}
		}
		opts, err := o.raft.nodeOptions(o.Logger)
		if err != nil {
			return nil, err
		}
		n, err := startMember(ctx, opts, o.Logger)
		if err != nil {
			return nil, err
		}
		b, err := raft.New(n, raft.Options{Config: backend.Config{TTL: o.TTL}, Logger: o.Logger})
		if err != nil {
			_ = closeWithin(ctx, 5*time.Second, "the raft member", o.Logger, n.Close)
			return nil, &exitError{code: exitUsage, err: err}
		}
		return &openBackend{Backend: b, node: n, close: func(ctx context.Context) error {
			// The session first, so its leases are released at once; then
			// the member hands raft leadership on and leaves.
			return errors.Join(b.Close(ctx), n.Close(ctx))
		}}, nil
	}, nil
}

// parseAgentURL accepts agent://HOST:PORT, a local `baton agent`.
func parseAgentURL(u *url.URL) (opener, error) {
	const form = "agent://HOST:PORT (the --http address of a `baton agent`, e.g. agent://127.0.0.1:8790)"
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
	return func(_ context.Context, o backendOptions) (*openBackend, error) {
		if token == "" {
			token = os.Getenv("BATON_HTTP_TOKEN")
		}
		copts := raft.ClientOptions{Token: token}
		// The default token file belongs to the agent on this host: it is
		// never sent to another one (BATON_HTTP_TOKEN_FILE is, if given).
		if token == "" && (isLoopback(host) || os.Getenv("BATON_HTTP_TOKEN_FILE") != "") {
			// From the agent's token file, read again when the agent
			// refuses it: an agent writes a new token at every start.
			copts.TokenSource = func() (string, error) { return agentClientToken(port, o.Logger) }
		}
		c, err := raft.Dial(u.Host, copts)
		if err != nil {
			return nil, err
		}
		b, err := raft.New(c, raft.Options{Config: backend.Config{TTL: o.TTL}, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		return &openBackend{Backend: b, close: b.Close}, nil
	}, nil
}

// agentClientToken reads the token of the agent at port from
// BATON_HTTP_TOKEN_FILE, or from the file the agent writes by default. A
// missing default file gives no token: reads work without one, and a call
// that needs it is refused with a message saying so.
func agentClientToken(port string, log *slog.Logger) (string, error) {
	if path := os.Getenv("BATON_HTTP_TOKEN_FILE"); path != "" {
		tok, err := readAgentToken(path)
		if err != nil {
			return "", &exitError{code: exitUsage, err: fmt.Errorf("BATON_HTTP_TOKEN_FILE: %w", err)}
		}
		return tok, nil
	}
	path, err := defaultAgentTokenFile(os.LookupEnv, port)
	if err != nil {
		log.Debug("no token for the agent", "err", err)
		return "", nil
	}
	tok, err := readAgentToken(path)
	if err != nil {
		log.Debug("no token for the agent: only reads will work", "file", path, "err", err)
		return "", nil
	}
	return tok, nil
}
