package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envAnnotation marks the flags that also read BATON_<NAME> from the
// environment. Only the settings that describe where an instance belongs are
// taken from the environment, so that a deployment can set them once for
// `baton run` and for the checks it runs; per-invocation knobs such as
// --timeout or --json are not, because an inherited value would silently
// change a script's behaviour.
const envAnnotation = "baton_env"

const envHelp = `Flags marked [$BATON_...] may instead be given as environment variables named
BATON_ plus the flag name in upper case with dashes as underscores (BATON_BACKEND,
BATON_LEASE, BATON_ID, BATON_TTL, BATON_LOG_LEVEL, BATON_GRACE). A flag given on the
command line wins over the environment.`

const rootLong = `baton runs work on exactly one instance of a group at a time and hands it over
quickly and safely when that instance dies, hangs or is shut down.

Backends (--backend URL):
  raft://                        this process is a member of an embedded raft group
                                 (run, cron and agent; see --join, BATON_SECRET, --secret-from)
  agent://host:port              the raft group, through the 'baton agent' of this host
                                 whose --http is host:port (reached on its Unix socket)
  agent:///path/to/agent.sock    the same, naming the agent's --socket
                                 (is-leader and leader also read through the --http
                                 of a 'baton run --backend raft://': any member)
  etcd://host:port[,host:port]   an etcd cluster (port defaults to 2379)
  zk://[user:password@]host:port[,host:port][/root]
                                 ZooKeeper (port 2181); lease NAME is the Curator
                                 LeaderLatch path ROOT/NAME (ROOT defaults to /baton);
                                 TLS: ?ca-file=F&cert-file=F&key-file=F
  consul://host:port[/prefix]    a Consul agent (port 8500); lease NAME is the
                                 'consul lock PREFIX/NAME' key (PREFIX defaults to
                                 baton); token and TLS from CONSUL_HTTP_TOKEN,
                                 CONSUL_CACERT, ... or ?token-file=F&ca-file=F&...
  k8s://[namespace][?kubeconfig=F&context=NAME]
                                 Kubernetes (coordination.k8s.io Leases, shared with
                                 client-go's leaderelection); lease NAME is the Lease
                                 NAME; server and credentials from the kubeconfig
                                 (?kubeconfig=F, else KUBECONFIG, else ~/.kube/config),
                                 else the pod's service account
  postgres://[user[:password]@]host[:port][,host:port][/db][?param=value&...]
                                 PostgreSQL (postgresql:// too): libpq's URL as pgx
                                 takes it (sslmode up to verify-full, PG* variables,
                                 passfile) plus baton's baton_schema=NAME (default
                                 baton), baton_create=false, baton_listen=URL (a
                                 direct connection for LISTEN behind PgBouncer) or
                                 baton_listen=off (waiters poll); see 'baton postgres schema'
  dynamodb://TABLE[?region=R&profile=P&endpoint=URL&poll=D]
                                 a DynamoDB table (see 'baton dynamodb create-table');
                                 region, credentials and endpoint by the AWS SDK's
                                 usual resolution (AWS_REGION, AWS_PROFILE, the
                                 instance role, AWS_ENDPOINT_URL_DYNAMODB); waiters
                                 poll every D (default the renew interval)
  redis://[user[:password]@]host[:port][/db][?param=value&...]
                                 Redis (rediss:// for TLS); lease NAME is the key
                                 baton:lease:NAME, a redsync mutex's key; baton's
                                 baton_prefix=P (default baton:), baton_replicas=N
                                 (WAIT for N replicas), baton_pubsub=off,
                                 baton_grant=on (a release grants the lease to the
                                 queue's head), password_file=F; Redis Cluster is
                                 refused
  redis+sentinel://[user[:password]@]s1[:port][,s2...]/MASTER[/db][?...]
                                 Redis through Sentinel (rediss+sentinel:// for TLS);
                                 baton_replicas defaults to 1, sentinel_password_file=F
  memory://                      in-process only; lets you try 'baton run' alone
  aws-asg://[GROUP]              is-leader and leader only: the Auto Scaling group's
                                 own rule, the InService, Healthy instance with the
                                 lowest id (GROUP defaults to this instance's); no
                                 lease, no token. Region and credentials: AWS_*
                                 variables, the shared config, the instance profile

Exit statuses:
  0  success (is-leader: this instance leads)
  1  is-leader: not the leader; leader: nobody leads; otherwise a runtime error
  2  usage or configuration error: a bad flag, environment variable, URL or
     file, or a setting the backend refuses for good (credentials, a TTL
     beyond the backend's limits: Consul's session_ttl_min to 48h, etcd's
     maximum lease TTL, ZooKeeper's maxSessionTimeout)
  3  undetermined: the backend did not answer within --timeout
     (run: --timeout passed before this instance was elected)
  4  run --once: the lease was lost while the command ran
  run --once passes the command's own exit status through.

` + envHelp

// Run executes the command line args (without the program name). It returns
// an error carrying the exit status (see exitCode), and never exits.
func (a *App) Run(ctx context.Context, args []string) error {
	root := a.newRootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return nil
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	var ce *baton.ConfigError
	if errors.As(err, &ce) {
		return err
	}
	// Only cobra's own argument parsing returns plain errors (every RunE
	// wraps its errors): unknown commands and the like.
	return usageErrorf("%w\nRun 'baton --help' for usage.", err)
}

func (a *App) newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "baton",
		Short:         "Leader election for any program",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if v, _ := cmd.Flags().GetBool("version"); v {
				_, err := fmt.Fprint(a.stdout(), buildVersion())
				return err
			}
			cmd.SetOut(a.stderr())
			_ = cmd.Usage()
			return usageErrorf("no command given: use one of run, cron, is-leader, leader, agent, tls, raft, postgres, demo, idle, version")
		},
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	// --version is a flag of the root command, handled by its RunE rather
	// than by cobra's Version field: cobra prints that through a
	// text/template, whose reflective method calls keep every exported
	// method of every type in the binary (the linker cannot tell which a
	// template calls), the whole AWS EC2 and Kubernetes API clients among
	// them. Defined here also so that it has no -v shorthand, which other
	// commands use for --verbose.
	root.Flags().Bool("version", false, "print baton's version and the commit it was built from (as baton version)")
	root.SetIn(a.Stdin)
	root.SetOut(a.stdout())
	root.SetErr(a.stderr())
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if hint := missingDash(cmd, err); hint != nil {
			return hint
		}
		return usageErrorf("%w\nRun '%s --help' for usage.", err, cmd.CommandPath())
	})
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return a.applyEnv(cmd.Flags())
	}
	root.AddCommand(
		a.newRunCommand(),
		a.newCronCommand(),
		a.newIsLeaderCommand(),
		a.newLeaderCommand(),
		a.newAgentCommand(),
		a.newTLSCommand(),
		a.newRaftCommand(),
		a.newPostgresCommand(),
		a.newDynamoCommand(),
		a.newDemoCommand(),
		a.newDemoJobCommand(),
		a.newIdleCommand(),
		a.newVersionCommand(),
	)
	return root
}

// wrapRunE makes every error a command returns carry an exit status, so that
// App.Run can tell them from cobra's parsing errors.
func wrapRunE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := f(cmd, args)
		if err == nil {
			return nil
		}
		var ee *exitError
		var ce *baton.ConfigError
		if errors.As(err, &ee) {
			return err
		}
		if errors.As(err, &ce) {
			return namingTTL(cmd.Flags(), err)
		}
		return &exitError{code: exitFailure, err: err}
	}
}

// envName is the environment variable for flag name.
func envName(flag string) string {
	return "BATON_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// withEnv marks the flag name of fs as readable from the environment and
// says so in its usage text.
func withEnv(fs *pflag.FlagSet, names ...string) {
	for _, name := range names {
		f := fs.Lookup(name)
		f.Usage += " [$" + envName(name) + "]"
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[envAnnotation] = []string{envName(name)}
	}
}

// applyEnv sets every env-enabled flag that the command line left alone
// from its BATON_<NAME> variable. The flag's Changed bit is left unset;
// flagSource tells where a value came from for error messages.
func (a *App) applyEnv(fs *pflag.FlagSet) error {
	var problems []string
	fs.VisitAll(func(f *pflag.Flag) {
		env, ok := f.Annotations[envAnnotation]
		if !ok || f.Changed {
			return
		}
		v, ok := a.lookupEnv(env[0])
		if !ok || v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			problems = append(problems, fmt.Sprintf("environment variable %s=%q is not a valid --%s: %v", env[0], v, f.Name, err))
			return
		}
		f.Annotations[envAnnotation] = append(env[:1], "set")
	})
	return problemsError(problems)
}

// flagSource names where the value of flag came from, for messages:
// "--ttl" or "BATON_TTL".
func flagSource(fs *pflag.FlagSet, name string) string {
	f := fs.Lookup(name)
	if f != nil && !f.Changed {
		if env := f.Annotations[envAnnotation]; len(env) == 2 {
			return env[0]
		}
	}
	return "--" + name
}

// problemsError reports all problems at once, so that a user fixes them in
// one go, as a usage error; nil when there are none.
func problemsError(problems []string) error {
	switch len(problems) {
	case 0:
		return nil
	case 1:
		return usageErrorf("%s", problems[0])
	default:
		return usageErrorf("%d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
}

// commonFlags are the flags every command that talks to a backend shares.
type commonFlags struct {
	backend  string
	lease    string
	id       string
	ttl      time.Duration
	logLevel string
	// member: the command may run a raft member (raft://); set by run.
	member bool
	// rule: the command takes aws-asg://, the group's rule (is-leader,
	// leader); ruleSelf: --id names the instance to ask about.
	rule, ruleSelf bool
	// isRule and ruleGroup: --backend is aws-asg://[ruleGroup].
	isRule    bool
	ruleGroup string

	fs *pflag.FlagSet // for flagSource
}

func (c *commonFlags) register(fs *pflag.FlagSet, idUsage string) {
	c.fs = fs
	fs.StringVar(&c.backend, "backend", "", "backend URL: raft:// (this process is a member), agent://host:port or agent:///SOCKET, etcd://host:port[,host:port], zk://host:port[,host:port][/root], consul://host:port[/prefix], k8s://[namespace], postgres://..., dynamodb://TABLE, redis://... or redis+sentinel://..., memory://, or aws-asg://[GROUP] (is-leader and leader only) (required)")
	fs.StringVar(&c.lease, "lease", "", "name of the lease (required, except with aws-asg://)")
	fs.StringVar(&c.id, "id", "", idUsage)
	fs.DurationVar(&c.ttl, "ttl", backend.DefaultTTL, "lease time-to-live: how long a dead leader keeps the lease before a standby takes over (default 20s with consul://, 5s with raft:// and agent://)")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level on stderr: debug, info, warn or error")
	withEnv(fs, "backend", "lease", "id", "ttl", "log-level")
}

// validate returns the problems with the common flags, each saying how to
// fix it, and the parsed backend URL when it is valid.
func (c *commonFlags) validate() ([]string, *backendurl.Spec) {
	if isRuleURL(c.backend) {
		return c.validateRule(), nil
	}
	var problems []string
	var spec *backendurl.Spec
	if c.backend == "" {
		problems = append(problems, "--backend is required: pass e.g. --backend etcd://127.0.0.1:2379, or set BATON_BACKEND")
	} else if s, err := backendurl.Parse(c.backend, kubernetesScheme(c.lease)); err != nil {
		hint := ""
		if scheme, _, _ := strings.Cut(c.backend, "://"); strings.EqualFold(scheme, "raft") {
			hint = " (with baton: --bind, --join, --bootstrap-expect and BATON_SECRET)"
		} else if strings.EqualFold(scheme, "agent") {
			hint = " (the --http address of a `baton agent`)"
		}
		problems = append(problems, fmt.Sprintf("%s %q: %v%s", flagSource(c.fs, "backend"), redactURL(c.backend), err, hint))
	} else if s.Scheme == "raft" && !c.member {
		problems = append(problems, fmt.Sprintf("%s raft:// would make this short-lived command a member of the group: ask a member through its --http instead, e.g. --backend agent://127.0.0.1:8080 (the --http of a baton run --backend raft://, or of a baton agent)", flagSource(c.fs, "backend")))
	} else {
		spec = s
	}
	if spec != nil && spec.Scheme == "raft" {
		// A witness votes but never campaigns: as a candidate it would
		// join the group and only then fail. Say so before joining.
		if f := c.fs.Lookup("witness"); f != nil && f.Value.String() == "true" {
			problems = append(problems, fmt.Sprintf("%s makes this member a witness, which votes but never campaigns, so it would never run the command: run the witness as `baton agent --witness`, and this command without it", flagSource(c.fs, "witness")))
		}
	}
	if c.lease == "" {
		problems = append(problems, "--lease is required: name the lease the group shares, e.g. --lease my-service, or set BATON_LEASE")
	} else if spec != nil {
		if err := spec.CheckLease(c.lease); err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(c.fs, "lease"), c.lease, err))
		}
	}
	if c.ttl <= 0 {
		problems = append(problems, fmt.Sprintf("%s %s: the TTL must be positive, e.g. --ttl 10s", flagSource(c.fs, "ttl"), c.ttl))
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(c.fs, "log-level"), c.logLevel, err))
	}
	return problems, spec
}

// ttlOrDefault returns --ttl (or BATON_TTL) if given, else 0: the backend's
// own default, which is not the same everywhere (Consul's is 20 s).
func (c *commonFlags) ttlOrDefault() time.Duration {
	if c.fs.Lookup("ttl").Changed || flagSource(c.fs, "ttl") != "--ttl" {
		return c.ttl
	}
	return 0
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, errors.New("unknown log level: use debug, info, warn or error")
	}
	return l, nil
}

// logger returns the text logger on w at the flag's level. Components log
// in groups of their own (baton, supervise, etcd, run).
func (c *commonFlags) logger(w io.Writer) *slog.Logger {
	l, _ := parseLevel(c.logLevel) // validated before
	return newLogger(w, l)
}

func newLogger(w io.Writer, l slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// redactURL hides the password of a URL's user information, for messages
// and logs.
func redactURL(raw string) string { return backendurl.Redact(raw) }

// commandAfterDash refuses arguments before "--" for commands that run the
// program given after it (run, cron); form is the command's usage, for the
// message.
func commandAfterDash(cmd *cobra.Command, args []string, form string) error {
	dash := cmd.ArgsLenAtDash()
	if dash == 0 || (dash < 0 && len(args) == 0) {
		return nil
	}
	before := args
	if dash > 0 {
		before = args[:dash]
	}
	return usageErrorf("unexpected argument %q: put the command after --, as in: %s -- %s",
		before[0], form, strings.Join(args, " "))
}
