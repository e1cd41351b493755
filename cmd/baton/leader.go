package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/batonhq/baton"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const leaderLong = `Print who holds the lease: its holder id, fencing token and, when the backend
records it, since when (etcd does not).

Text output:  holder=ID token=N [since=RFC3339]
JSON output:  {"lease":"L","holder":"ID","token":"N"[,"since":"RFC3339"]}
              (the token is a decimal string: tokens exceed 2^53, past which
              JSON numbers lose digits in JavaScript and jq 1.6)

With --backend postgres://, baton also says how waiters learn of a release:
when notifications are off (LISTEN does not work through PgBouncer in
transaction-pooling mode; or baton_listen=off), a line on stderr says that
waiters poll, how often, and why; JSON adds "notifications":"listen", "poll"
or "undetermined" (the probe, 5 s through PgBouncer, outlasted --timeout)
and "notifications_reason".

With --backend agent://HOST:PORT, HOST:PORT may be the --http of any member
of a raft group, a 'baton agent' or a 'baton run --backend raft://' (see
is-leader --help).

When nobody holds the lease, baton says so on stderr and exits 1; with --json it
also prints {"lease":"L","holder":null} on stdout, so that a pipeline into jq
still gets a document.

With --backend aws-asg://[GROUP] (the group's rule; see is-leader --help):
Text output:  instance=ID private_ip=IP group=G decided="HOW"
JSON output:  {"backend":"aws-asg","group":"G","instance_id":"ID",
               "private_ip":"IP","decided":"HOW"}   (instance_id null: nobody)
Exit statuses as is-leader's with aws-asg://, 1 meaning nobody qualifies.

With --backend aws-tag://KEY[=VALUE] (for agentless groups, where
baton-lambda or run --aws-tag tags the leader): what this instance's own
metadata (IMDSv2 instance-metadata tags) says. It cannot name another
instance: when this one is not tagged, baton says so on stderr and exits 1,
and another instance may lead (aws ec2 describe-instances --filters
Name=tag-key,Values=KEY Name=instance-state-name,Values=running names it).
Text output:  holder=THIS_INSTANCE_ID [token=N] tag=KEY=VALUE
              (token: the KEY-token tag, when the tagger writes one)
JSON output:  {"backend":"aws-tag","tag":"KEY","instance_id":"ID",
               "holder":"ID","value":"V"[,"token":"N"]}
              (holder null when this instance is not tagged; value then
              present only if the tag has another value than VALUE)
Exit statuses as is-leader's with aws-tag://: 1 this instance is not
tagged, 3 the metadata cannot be read (tags in metadata off included).

Exit statuses:
  0  printed the holder
  1  nobody holds the lease
  2  usage or configuration error
  3  undetermined: the backend did not answer within --timeout

` + envHelp

type leaderCommand struct {
	app     *App
	common  commonFlags
	timeout time.Duration
	json    bool
	fs      *pflag.FlagSet
}

func (a *App) newLeaderCommand() *cobra.Command {
	c := &leaderCommand{app: a}
	cmd := &cobra.Command{
		Use:   "leader [flags] [--json]",
		Short: "Print who holds the lease",
		Long:  leaderLong,
		Args:  noArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			return c.Run(cmd.Context(), args)
		}),
	}
	c.fs = cmd.Flags()
	c.common.register(c.fs, "unused; accepted so that the same environment serves every command")
	c.fs.DurationVar(&c.timeout, "timeout", defaultQueryTimeout, "give up (exit 3) when the backend has not answered within this time")
	c.fs.BoolVar(&c.json, "json", false, "print one JSON object")
	c.common.rule = true
	return cmd
}

// leaderJSON is the --json document. Holder is a pointer so that "no
// leader" is an explicit null.
type leaderJSON struct {
	Lease  string  `json:"lease"`
	Holder *string `json:"holder"`
	Token  string  `json:"token,omitempty"` // decimal: tokens exceed 2^53, past which JSON numbers lose digits in many readers
	Since  string  `json:"since,omitempty"`
	// Notifications (postgres:// only) is how waiters learn of a
	// release: "listen", "poll" or "undetermined"; the reason says why not
	// "listen".
	Notifications       string `json:"notifications,omitempty"`
	NotificationsReason string `json:"notifications_reason,omitempty"`
}

// sayNotifications tells, on stderr, that waiters poll rather than wake on
// a release: hand-overs then take up to a poll interval longer.
func (c *leaderCommand) sayNotifications(n notifications) {
	if n.Mode == "" || n.Mode == "listen" {
		return
	}
	if n.Mode == "poll" {
		fmt.Fprintf(c.app.stderr(), "baton: notifications are off: waiters poll every %s, so a hand-over takes up to that long (%s)\n", n.Poll, n.Reason)
		return
	}
	fmt.Fprintf(c.app.stderr(), "baton: notifications undetermined: %s; waiters poll every %s until LISTEN works\n", n.Reason, n.Poll)
}

// Run prints the holder of the lease.
func (c *leaderCommand) Run(ctx context.Context, _ []string) error {
	if isTagURL(c.common.backend) {
		if c.timeout <= 0 {
			return usageErrorf("--timeout %s: must be positive, e.g. --timeout 5s", c.timeout)
		}
		return c.tagLeader(ctx)
	}
	problems, spec := c.common.validate()
	if c.timeout <= 0 {
		problems = append(problems, fmt.Sprintf("--timeout %s: must be positive, e.g. --timeout 5s", c.timeout))
	}
	if err := problemsError(problems); err != nil {
		return err
	}
	if c.common.isRule {
		return c.ruleLeader(ctx)
	}
	var notes notifications
	rec, err := queryLeader(ctx, spec, &c.common, c.timeout, c.app, &notes)
	out := c.app.stdout()
	c.sayNotifications(notes)
	if errors.Is(err, baton.ErrNoLeader) {
		if c.json {
			b, _ := json.Marshal(leaderJSON{Lease: c.common.lease, Notifications: notes.Mode, NotificationsReason: notes.Reason})
			fmt.Fprintf(out, "%s\n", b)
		}
		return &exitError{code: exitFailure, err: fmt.Errorf("nobody holds lease %q", c.common.lease)}
	}
	if err != nil {
		return err
	}
	var since string
	if !rec.Since.IsZero() {
		since = rec.Since.Format(time.RFC3339Nano)
	}
	if c.json {
		b, err := json.Marshal(leaderJSON{Lease: c.common.lease, Holder: &rec.Holder, Token: strconv.FormatUint(rec.Token, 10), Since: since,
			Notifications: notes.Mode, NotificationsReason: notes.Reason})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	}
	line := fmt.Sprintf("holder=%s token=%d", rec.Holder, rec.Token)
	if since != "" {
		line += " since=" + since
	}
	_, err = fmt.Fprintln(out, line)
	return err
}
