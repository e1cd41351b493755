package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const raftLong = `Operate an embedded raft group (--backend raft://).`

const raftRecoverLong = `Recover a raft group that has lost the majority of its voters, on your word
that the lost voters are gone for good.

A group that loses most of its voters elects no one: the members that live
cannot tell dead voters from voters behind a partition, and a minority that
went on alone could be a second group beside a majority that still lives.
Where the Auto Scaling group proves the lost voters' instances terminated
(--join aws-asg), the members recover by themselves. Elsewhere (static or DNS
discovery, or instances that are only silent), each surviving member logs at
ERROR which voters it lost, since when, and this command, with its own
address and the lost voters' addresses filled in.

The command reaches the member at --member over the group port, with the
group's secret (and its TLS files in CA mode: the same flags and BATON_*
variables as the member's), and asks it to recover: it restarts its raft in place as the
group's only voter, takes a new epoch (fencing tokens keep rising), grants no
lease until the group's longest TTL (--max-ttl) has passed, and the other
members and replacements join it. The member refuses, and changes nothing,
when the group has a leader, when --lost names a member that is not one of its
voters or names itself, when voters that --lost does not name do not answer
either, when the voters that answer are a quorum, or when another member that
answers has a more advanced log (the message names it: recover that one).

Only name voters that can never come back (their machines are gone, their
data too): one that comes back later joins the recovered group, but whatever
it alone knew is lost.

Exit statuses: 0 recovered; 1 the member refused (its reason is printed);
2 bad flags, or the member refused the secret; 3 the member could not be
reached within --timeout.`

// raftRecoverCommand is `baton raft recover`.
type raftRecoverCommand struct {
	app     *App
	fs      *pflag.FlagSet
	raft    raftFlags
	member  string
	lost    []string
	timeout time.Duration
}

func (a *App) newRaftCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "raft",
		Short: "Operate an embedded raft group: recover from a lost majority",
		Long:  raftLong,
		Args:  noArgs,
	}
	c := &raftRecoverCommand{app: a}
	rec := &cobra.Command{
		Use:   "recover --member HOST:PORT --lost HOST:PORT[,HOST:PORT...]",
		Short: "Recover a group that lost most of its voters, on your word that they are gone for good",
		Long:  raftRecoverLong,
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, args []string) error { return c.Run(cmd.Context()) }),
	}
	c.fs = rec.Flags()
	c.fs.StringVar(&c.member, "member", "", "the surviving member to recover, at its group address (HOST:PORT, as its log line names it)")
	c.fs.StringSliceVar(&c.lost, "lost", nil, "the lost voters' addresses (HOST:PORT, comma-separated), as the member's log line names them")
	c.fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "how long to wait for the member's answer")
	c.raft.register(c.fs)
	cmd.AddCommand(rec)
	return cmd
}

// Run asks the member to recover and prints what it did.
func (c *raftRecoverCommand) Run(ctx context.Context) error {
	var problems []string
	if c.member == "" {
		problems = append(problems, "--member is required: the surviving member's group address (HOST:PORT), as its ERROR line names it")
	} else if err := checkHostPort(c.member, 1); err != nil {
		problems = append(problems, fmt.Sprintf("--member %q: %v; want HOST:PORT, e.g. 10.0.0.5:%d", c.member, err, defaultRaftPort))
	}
	if len(c.lost) == 0 {
		problems = append(problems, "--lost is required: the addresses (HOST:PORT) of the voters that are gone for good, as the member's ERROR line names them")
	}
	for _, l := range c.lost {
		if err := checkHostPort(l, 1); err != nil {
			problems = append(problems, fmt.Sprintf("--lost %q: %v; want HOST:PORT", l, err))
		}
	}
	if c.timeout <= 0 {
		problems = append(problems, fmt.Sprintf("--timeout %s: want a positive duration", c.timeout))
	}
	// Only the TLS files and the secret are used; the flags that place a
	// member (--bind, --join, ...) may come from the member's BATON_*
	// variables, and are checked as the member checks them.
	problems = append(problems, c.raft.validate()...)
	if err := problemsError(problems); err != nil {
		return err
	}
	if c.raft.advertise == "" {
		// The member's options need an address to advertise, which this
		// command never does: the member's own stands in.
		c.raft.advertise = c.member
	}
	opts, err := c.raft.nodeOptions(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := raft.RequestRecovery(ctx, opts.TLS, append([]string{opts.Secret}, opts.PreviousSecrets...), c.member, c.lost)
	var refused *raft.RecoveryRefusedError
	switch {
	case errors.Is(err, raft.ErrSecretRefused):
		return &exitError{code: exitUsage, err: fmt.Errorf("%s refused the secret: give the group's (BATON_SECRET, --secret-file or --secret-from): %w", c.member, err)}
	case errors.As(err, &refused) && refused.Status == http.StatusUnauthorized:
		return &exitError{code: exitUsage, err: fmt.Errorf("%s refused the secret: give the group's (BATON_SECRET, --secret-file or --secret-from): %s", c.member, refused.Reason)}
	case errors.As(err, &refused):
		return &exitError{code: exitFailure, err: fmt.Errorf("%s did not recover, and changed nothing: %s", c.member, refused.Reason)}
	case err != nil:
		return &exitError{code: exitUndetermined, err: fmt.Errorf("could not reach %s within --timeout %s: %w; is it running, and are --member and the TLS files right?", c.member, c.timeout, err)}
	}
	fmt.Fprintf(c.app.stdout(), "recovered: member %s at %s leads the group alone; it grants no lease until its longest TTL has passed, and the other members join it.\nwhat it found: %s\n", res.ID, res.Addr, res.Summary)
	return nil
}
