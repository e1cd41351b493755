package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const isLeaderLong = `Ask the backend whether this instance holds the lease, for scripts and health
checks. Prints nothing on stdout unless --verbose; errors go to stderr.

"This instance" is the holder whose id equals --id. Without --id it is any
holder on this host: an id whose part before the last "/" equals the host name,
which is the form 'baton run' gives ids by default (HOST/RANDOM). So a script
on the same host as 'baton run' works without knowing the random suffix. (A
'baton run' child also has BATON_LEASE set, so inside it only --backend is
needed.)

With --backend agent://HOST:PORT, HOST:PORT may be the --http of any member
of a raft group: a 'baton agent', or a 'baton run' or 'baton cron' with
--backend raft:// (which serves these reads beside its status page), so that
checking leadership needs no second daemon; the answer goes through the raft
leader, as from an agent. An address with no agent socket on this host is
read over TCP (so is one whose socket nobody serves, left by an agent that was
killed), where nothing proves who answers (no credential is sent): keep
such a --http on loopback or a network you trust. A run on another backend
answers that it is not a raft member (exit 2): ask its backend instead.

With --backend aws-asg://[GROUP] the answer is the Auto Scaling group's own
rule, with no lease: the leader is the InService, Healthy instance with the
lowest instance id (EC2 reporting it pending or running); Pending, Standby,
Terminating and Unhealthy instances never are. "This instance" is the one
IMDSv2 names (or --id i-...); GROUP defaults to its group; --lease is not
needed. It reads only the group (DescribeAutoScalingGroups, and
DescribeAutoScalingInstances without GROUP) and DescribeInstances for the
winner. Two instances asking at different moments may each see itself first
while the group changes: for work that must never run twice at once, use a
lease (run --backend raft:// --join aws-asg).

With --backend aws-tag://KEY[=VALUE] the answer is this instance's own tag,
as baton-lambda or run --aws-tag writes it, read through IMDSv2
instance-metadata tags (InstanceMetadataTags on): 0 when the tag is there
(with VALUE, if given), 1 when it is not, 3 when the metadata cannot be
read. It holds no lease and promises no safe-until (docs/aws.md).

Exit statuses:
  0  this instance leads
  1  another instance leads, or nobody does
  2  usage or configuration error; with aws-asg://: no region or no
     credentials, AWS refused them, no such group, this instance in no group
  3  undetermined: the backend did not answer within --timeout; with
     aws-asg://: any other AWS error (throttling, 5xx), never 1

` + envHelp

const defaultQueryTimeout = 5 * time.Second

type isLeaderCommand struct {
	app     *App
	common  commonFlags
	timeout time.Duration
	verbose bool
	fs      *pflag.FlagSet
}

func (a *App) newIsLeaderCommand() *cobra.Command {
	c := &isLeaderCommand{app: a}
	cmd := &cobra.Command{
		Use:     "is-leader [flags]",
		Short:   "Exit 0 if this instance holds the lease, 1 if not, 3 if unknown",
		Long:    isLeaderLong,
		Args:    noArgs,
		Example: `  baton is-leader --backend etcd://10.0.0.5:2379 --lease billing-cron && ./run-leader-only-task`,
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			return c.Run(cmd.Context(), args)
		}),
	}
	c.fs = cmd.Flags()
	c.common.register(c.fs, "this instance's candidate id (default: any holder on this host)")
	c.fs.DurationVar(&c.timeout, "timeout", defaultQueryTimeout, "give up (exit 3) when the backend has not answered within this time")
	c.fs.BoolVarP(&c.verbose, "verbose", "v", false, "print the answer and the holder on stdout")
	c.common.rule, c.common.ruleSelf = true, true
	return cmd
}

// noArgs rejects positional arguments as a usage error naming the command.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q: %s takes only flags; see '%s --help'", args[0], cmd.Name(), cmd.CommandPath())
	}
	return nil
}

// Run answers whether this instance leads, through the exit status.
func (c *isLeaderCommand) Run(ctx context.Context, _ []string) error {
	if isTagURL(c.common.backend) {
		if c.timeout <= 0 {
			return usageErrorf("--timeout %s: must be positive, e.g. --timeout 5s", c.timeout)
		}
		return c.tagIsLeader(ctx)
	}
	problems, spec := c.common.validate()
	if c.timeout <= 0 {
		problems = append(problems, fmt.Sprintf("--timeout %s: must be positive, e.g. --timeout 5s", c.timeout))
	}
	if err := problemsError(problems); err != nil {
		return err
	}
	if c.common.isRule {
		return c.ruleIsLeader(ctx)
	}
	match, err := c.matcher()
	if err != nil {
		return err
	}
	rec, err := queryLeader(ctx, spec, &c.common, c.timeout, c.app, nil)
	out := c.app.stdout()
	switch {
	case errors.Is(err, baton.ErrNoLeader):
		if c.verbose {
			fmt.Fprintf(out, "not leader: nobody holds lease %q\n", c.common.lease)
		}
		return &exitError{code: exitFailure}
	case err != nil:
		return err
	case match(rec.Holder):
		if c.verbose {
			fmt.Fprintf(out, "leader: holder=%s token=%d\n", rec.Holder, rec.Token)
		}
		return nil
	default:
		if c.verbose {
			fmt.Fprintf(out, "not leader: holder=%s token=%d\n", rec.Holder, rec.Token)
		}
		return &exitError{code: exitFailure}
	}
}

// matcher decides which holders count as this instance.
func (c *isLeaderCommand) matcher() (func(holder string) bool, error) {
	if c.common.id != "" {
		id := c.common.id
		return func(h string) bool { return h == id }, nil
	}
	host, err := c.app.hostname()
	if err != nil || host == "" {
		return nil, usageErrorf("cannot tell which holder is this instance: the host name is unknown (%v); pass --id", err)
	}
	return func(h string) bool { return hostOf(h) == host }, nil
}

// hostOf returns the host part of a candidate ID made by
// baton.NewCandidateID (HOST/RANDOM): everything before the last "/", or id
// itself when it has none.
func hostOf(id string) string {
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		return id[:i]
	}
	return id
}

// queryLeader opens the backend and asks it for the holder of the lease,
// all within timeout. Failing to get an answer is exit status 3.
func queryLeader(ctx context.Context, spec *backendurl.Spec, common *commonFlags, timeout time.Duration, app *App, notes *notifications) (baton.Record, error) {
	log := common.logger(app.stderr())
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	b, err := app.openBackend(qctx, spec, common.ttlOrDefault(), log, nil)
	if err != nil {
		var ce *baton.ConfigError
		var ee *exitError
		if errors.As(err, &ce) || errors.As(err, &ee) {
			return baton.Record{}, err // a usage error: a bad file, say
		}
		return baton.Record{}, undetermined(qctx, common, timeout, err)
	}
	defer func() {
		// --timeout bounds the whole command: a close still running when
		// it ends (a ZooKeeper client waits up to a second for its close
		// request to be answered) finishes, or not, as the process exits.
		done := make(chan struct{})
		go func() { defer close(done); closeBackend(ctx, b, log) }()
		select {
		case <-done:
		case <-qctx.Done():
		}
	}()
	rec, err := b.Leader(qctx, common.lease)
	if notes != nil && (err == nil || errors.Is(err, baton.ErrNoLeader)) {
		*notes = notificationsOf(qctx, b.Backend)
	}
	if ce := (*baton.ConfigError)(nil); errors.As(err, &ce) {
		// An answer that retrying cannot change: agent:// at a process
		// that serves no raft reads, say.
		return rec, &exitError{code: exitUsage, err: fmt.Errorf("asking %s who holds lease %q: %w", redactURL(common.backend), common.lease, err)}
	}
	if err != nil && !errors.Is(err, baton.ErrNoLeader) {
		return rec, undetermined(qctx, common, timeout, err)
	}
	return rec, err
}

func undetermined(ctx context.Context, common *commonFlags, timeout time.Duration, err error) error {
	switch {
	case stoppedBySignal(ctx):
		err = fmt.Errorf("interrupted (%v) before the backend answered", context.Cause(ctx))
	case ctx.Err() != nil:
		err = fmt.Errorf("no answer from %s within --timeout %s (%v): check that the backend is running and reachable, or raise --timeout",
			redactURL(common.backend), timeout, err)
	default:
		err = fmt.Errorf("asking %s who holds lease %q: %w", redactURL(common.backend), common.lease, err)
	}
	return &exitError{code: exitUndetermined, err: err}
}

// notifications says how a backend's waiters learn of a release, for
// `baton leader`: on PostgreSQL, by LISTEN/NOTIFY, or by polling when
// notifications do not work (through PgBouncer in transaction-pooling
// mode) or are turned off. Mode is "" for backends without the choice.
type notifications struct {
	Mode   string // "listen", "poll", or "undetermined"
	Reason string // why "poll" or "undetermined"
	Poll   time.Duration
}

// notificationsOf waits, within ctx, until b (a PostgreSQL backend) knows
// whether notifications reach it: one round trip on a direct connection,
// the probe's timeout through PgBouncer.
func notificationsOf(ctx context.Context, b baton.Backend) notifications {
	pb, ok := b.(*postgres.Backend)
	if !ok {
		return notifications{}
	}
	poll := pb.Config().RenewInterval
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		st := pb.Notifications()
		switch {
		case st.Listening:
			return notifications{Mode: "listen"}
		case st.Polling:
			return notifications{Mode: "poll", Reason: st.Reason, Poll: poll}
		}
		select {
		case <-ctx.Done():
			return notifications{Mode: "undetermined", Poll: poll,
				Reason: "the LISTEN probe did not finish within --timeout (through PgBouncer it takes 5 s to fail); raise --timeout to know"}
		case <-t.C:
		}
	}
}
