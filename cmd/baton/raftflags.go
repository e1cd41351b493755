package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/aws"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/batonhq/baton/discovery"
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
	bootstrapAuto   bool // --bootstrap-expect auto
	voters          int
	witness         bool
	tlsCA           string
	tlsCert         string
	tlsKey          string
	secret          string
	secretFile      string
	secretFrom      string
	reloadEvery     time.Duration
	maxTTL          time.Duration

	// onRenew, if set, gets the member's session renewals (--http's
	// metrics).
	onRenew func(took time.Duration, err error)

	// name begins the member's ID when it makes one (raft.NodeOptions.Name):
	// run's candidate id, the agent's HOST-agent.
	name string

	fs *pflag.FlagSet
}

func (r *raftFlags) register(fs *pflag.FlagSet) {
	r.fs = fs
	fs.StringVar(&r.bind, "bind", fmt.Sprintf("0.0.0.0:%d", defaultRaftPort), "raft: address to listen on for the group (raft and member API share it)")
	fs.StringVar(&r.advertise, "advertise", "", "raft: address peers reach this member at (default: the bind address, or this host's first private IPv4 when bound to 0.0.0.0)")
	fs.StringVar(&r.dataDir, "data-dir", "", "raft: directory for the log and snapshots, kept across restarts (default: in memory; a new member at every start)")
	fs.StringVar(&r.join, "join", "", "raft: where to find peers: static:HOST[:PORT],... | dns:NAME[:PORT] | dns:_SERVICE._tcp.NAME | aws-asg[:GROUP]")
	r.bootstrapExpect = 3
	fs.Var(&expectFlag{n: &r.bootstrapExpect, auto: &r.bootstrapAuto}, "bootstrap-expect", "raft: form a new group once this many members are seen, none in a group yet (0: only join an existing group; auto, with --join aws-asg: min(the group's desired capacity, 3), once that many instances are InService)")
	fs.IntVar(&r.voters, "voters", 3, "raft: number of voting members (3 or 5); the others replicate without voting")
	fs.BoolVar(&r.witness, "witness", false, "raft: vote, never campaign (the third member beside two application instances)")
	fs.StringVar(&r.tlsCA, "tls-ca", "", "raft: PEM file of the group's CA (made by baton tls ca); with --tls-cert and --tls-key, CA mode (default: none, the secret-only mode: each member makes its own certificate)")
	fs.StringVar(&r.tlsCert, "tls-cert", "", "raft: PEM file of this member's certificate, signed by the group's CA (CA mode)")
	fs.StringVar(&r.tlsKey, "tls-key", "", "raft: PEM file of this member's private key (CA mode)")
	fs.StringVar(&r.secret, "secret", "", "raft: the group's join secret, 16+ random bytes (prefer BATON_SECRET, --secret-file or --secret-from: flags show in ps)")
	fs.StringVar(&r.secretFile, "secret-file", "", "raft: file holding the group's join secret (one per line during a rotation, the one to prove first first); re-read every --reload-every")
	fs.StringVar(&r.secretFrom, "secret-from", "", "raft: read the group's join secret from AWS through the instance's role: ssm:PARAMETER (Parameter Store SecureString) | secretsmanager:NAME; re-read every --reload-every")
	fs.DurationVar(&r.reloadEvery, "reload-every", raft.DefaultReloadEvery, "raft: how often to re-read --secret-file, --secret-from and the --tls-* files, so that a rotation needs no restart")
	fs.DurationVar(&r.maxTTL, "max-ttl", raft.DefaultMaxTTL, "raft: the longest TTL the group grants, the same on every member; after a recovery from a lost majority no lease is granted for this long")
	withEnv(fs, "bind", "advertise", "data-dir", "join", "bootstrap-expect", "voters", "witness", "tls-ca", "tls-cert", "tls-key", "secret", "secret-file", "secret-from", "reload-every", "max-ttl")
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
		} else if host, _, _ := net.SplitHostPort(r.advertise); net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
			problems = append(problems, fmt.Sprintf("%s %q: %s is no address peers can dial; want the HOST:PORT peers reach this member at, e.g. 10.0.0.5:%d", flagSource(r.fs, "advertise"), r.advertise, host, defaultRaftPort))
		}
	}
	if r.join != "" {
		if _, err := discovery.Parse(r.join, defaultRaftPort, discoveryOptions(aws.ASGOptions{})); err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(r.fs, "join"), r.join, err))
		}
	}
	if r.bootstrapAuto && !joinsASG(r.join) {
		problems = append(problems, fmt.Sprintf("%s auto counts the instances of an Auto Scaling group: use it with --join aws-asg[:GROUP], or give a number", flagSource(r.fs, "bootstrap-expect")))
	}
	if r.bootstrapExpect < 0 {
		problems = append(problems, fmt.Sprintf("%s %d: use 0 (join only) or the number of members to wait for", flagSource(r.fs, "bootstrap-expect"), r.bootstrapExpect))
	}
	if r.maxTTL <= 0 {
		problems = append(problems, fmt.Sprintf("%s %s: want a positive duration, the same on every member (default %s)", flagSource(r.fs, "max-ttl"), r.maxTTL, raft.DefaultMaxTTL))
	}
	if r.voters != 1 && r.voters != 3 && r.voters != 5 && r.voters != 7 {
		problems = append(problems, fmt.Sprintf("%s %d: use 3 or 5 (1 for a test; an even number adds no fault tolerance)", flagSource(r.fs, "voters"), r.voters))
	}
	if r.caMode() {
		for _, f := range []struct{ name, val string }{{"tls-ca", r.tlsCA}, {"tls-cert", r.tlsCert}, {"tls-key", r.tlsKey}} {
			if f.val == "" {
				problems = append(problems, fmt.Sprintf("--%s is missing: CA mode takes --tls-ca, --tls-cert and --tls-key together (`baton tls ca` and `baton tls cert` make the files; or set %s); give none of them for the secret-only mode, where the secret alone authenticates members", f.name, envName(f.name)))
			}
		}
	}
	var sources []string
	for _, f := range []struct{ name, val string }{{"secret", r.secret}, {"secret-file", r.secretFile}, {"secret-from", r.secretFrom}} {
		if f.val != "" {
			sources = append(sources, flagSource(r.fs, f.name))
		}
	}
	switch {
	case len(sources) > 1:
		problems = append(problems, fmt.Sprintf("give the join secret once: %s are all set; keep one of --secret (BATON_SECRET), --secret-file and --secret-from", strings.Join(sources, " and ")))
	case len(sources) == 0:
		problems = append(problems, "the group's join secret is required with raft: set BATON_SECRET, --secret-file or --secret-from ssm:PARAMETER|secretsmanager:NAME (16+ random bytes, e.g. from `openssl rand -hex 32`)")
	case r.secret != "":
		if _, _, err := raft.ParseSecrets(r.secret); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", flagSource(r.fs, "secret"), err))
		}
	case r.secretFrom != "":
		if _, _, err := aws.ParseSecretSource(r.secretFrom); err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(r.fs, "secret-from"), r.secretFrom, err))
		}
	}
	if r.reloadEvery <= 0 {
		problems = append(problems, fmt.Sprintf("%s %s: must be positive, e.g. 30s", flagSource(r.fs, "reload-every"), r.reloadEvery))
	}
	return problems
}

// validateUnused returns a problem for each raft flag given on the command
// line to run or cron with a backend other than raft (scheme), which would
// ignore it: the user meant a raft member, or has a stale flag to drop.
// --join aws-asg is not one: it also watches the instance on any backend.
// Values from BATON_* variables are not checked, since one environment may
// serve several commands.
func (r *raftFlags) validateUnused(scheme string) []string {
	var problems []string
	r.fs.VisitAll(func(f *pflag.Flag) {
		if !f.Changed || !strings.HasPrefix(f.Usage, "raft: ") || (f.Name == "join" && joinsASG(r.join)) {
			return
		}
		problems = append(problems, fmt.Sprintf("--%s is a raft flag, and the backend is %s://, which ignores it: use --backend raft:// for a raft member, or drop --%s", f.Name, scheme, f.Name))
	})
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
	return backendurl.CheckHost(host)
}

// nodeOptions reads the TLS files and the secret and returns the member's
// options.
func (r *raftFlags) nodeOptions(ctx context.Context, log *slog.Logger) (raft.NodeOptions, error) {
	creds, err := r.newCredentials(ctx)
	if err != nil {
		return raft.NodeOptions{}, err
	}
	secrets, tlsCfg, err := creds.load(ctx, true)
	if err != nil {
		return raft.NodeOptions{}, err
	}
	advertise := r.advertise
	if advertise == "" {
		if advertise, err = raft.AdvertiseFor(r.bind); err != nil {
			return raft.NodeOptions{}, &exitError{code: exitUsage, err: fmt.Errorf("--bind %s listens on every address, and %v: set --advertise to the address peers reach this member at", r.bind, err)}
		}
	}
	opts := raft.NodeOptions{
		Name:            r.name,
		DataDir:         r.dataDir,
		BindAddr:        r.bind,
		AdvertiseAddr:   advertise,
		TLS:             tlsCfg,
		Secret:          secrets[0],
		PreviousSecrets: secrets[1:],
		ReloadEvery:     r.reloadEvery,
		BootstrapExpect: r.bootstrapExpect,
		Voters:          r.voters,
		Witness:         r.witness,
		MaxTTL:          r.maxTTL,
		Logger:          log,
	}
	if creds.reloads() {
		opts.Reloader = creds
	}
	if r.join != "" {
		d, err := discovery.Parse(r.join, defaultRaftPort, discoveryOptions(aws.ASGOptions{Logger: log}))
		if err != nil {
			return raft.NodeOptions{}, &exitError{code: exitUsage, err: err}
		}
		opts.Discovery = d
		if a, ok := d.(*aws.ASG); ok {
			// The group's membership drives the raft group's: the leader
			// removes members whose instances the group is terminating
			// or no longer has, and auto waits for the group to fill.
			opts.Departures = a
			// And EC2's word that instances are terminated lets members
			// recover a group that lost its quorum (docs/aws.md).
			opts.Terminations = a
			if r.bootstrapAuto {
				opts.ExpectCounter, opts.BootstrapExpect = a, 0
			}
		}
	}
	return opts, nil
}

// startMember starts a member and waits until it is in a group, logging
// while it waits.
func startMember(ctx context.Context, opts raft.NodeOptions, log *slog.Logger) (*raft.Node, error) {
	opts.Logger = log
	n, err := raft.StartMember(ctx, opts, 5*time.Second)
	var oe *net.OpError
	switch {
	case err == nil:
		return n, nil
	case errors.As(err, &oe) && oe.Op == "listen":
		return nil, fmt.Errorf("%w; --bind %s must be a free port on an address of this host: stop what listens there (another member?), or choose another --bind", err, opts.BindAddr)
	case errors.Is(err, raft.ErrSecretRefused):
		// Refused by a live group for the secret: retrying cannot help,
		// so this is a configuration error.
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("%w: set BATON_SECRET (or --secret-file) to the group's secret", err)}
	case errors.Is(err, raft.ErrCertificateRefused):
		// A majority of the peers refused the certificate, or presented
		// ones of another CA: retrying cannot help.
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("%w: give this member the group's CA certificate (--tls-ca) and a certificate and key that CA signed (--tls-cert, --tls-key; `baton tls cert` makes them)", err)}
	}
	return nil, err
}

// agentClientToken reads the token of the agent whose socket is socket
// from BATON_HTTP_TOKEN_FILE, or from the file beside the socket, where the
// agent writes it by default. A missing default file gives no token: reads
// work without one, and a call that needs it is refused with a message
// saying so.
func agentClientToken(lookupEnv func(string) (string, bool), socket string, log *slog.Logger) (string, error) {
	if path, _ := lookupEnv("BATON_HTTP_TOKEN_FILE"); path != "" {
		tok, err := readAgentToken(path)
		if err != nil {
			return "", &exitError{code: exitUsage, err: fmt.Errorf("BATON_HTTP_TOKEN_FILE: %w", err)}
		}
		return tok, nil
	}
	path := agentTokenFileOf(socket)
	tok, err := readAgentToken(path)
	if err != nil {
		log.Debug("no token for the agent: only reads will work", "file", path, "err", err)
		return "", nil
	}
	return tok, nil
}

// discoveryOptions are the --join schemes: the built-in ones, and aws-asg
// built with asg.
func discoveryOptions(asg aws.ASGOptions) discovery.Options {
	return discovery.Options{Schemes: []discovery.Scheme{aws.ASGScheme(asg)}}
}

// expectFlag is --bootstrap-expect: a count, or "auto".
type expectFlag struct {
	n    *int
	auto *bool
}

func (f *expectFlag) String() string {
	if f.n == nil {
		return "3"
	}
	if *f.auto {
		return "auto"
	}
	return strconv.Itoa(*f.n)
}

func (f *expectFlag) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		*f.auto, *f.n = true, 0
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("want a number of members or auto")
	}
	*f.auto, *f.n = false, n
	return nil
}

func (f *expectFlag) Type() string { return "N|auto" }
