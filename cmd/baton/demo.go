package main

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/cmd/baton/internal/demo"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const demoLong = `Show failover on this machine, with nothing installed but baton.

The demo makes a random secret, and nothing else: it starts --nodes copies
of this binary on loopback with BATON_SECRET set, each a member of one
embedded raft group that makes its own TLS key and certificate in memory
(the secret-only mode; no files):

  BATON_SECRET=... baton run --backend raft:// --bind 127.0.0.1:PORT-K
            --join static:PORT-1,... --bootstrap-expect 3
            --lease demo --id node-K --ttl TTL -- baton demo-job

where demo-job prints "node-K working with token N" every 500ms. The first
three members seen form the group (3 voters); the others join as non-voters.
Every --interval the demo kills the current leader, alternating kill -9 (a
crash: the others must wait until the dead leader's session expires, about
--ttl, up to half a heartbeat timeout more when the dead node was also the
raft leader) and
SIGTERM (a shutdown: the leader stops its job, resigns and leaves the group,
and a standby takes over at once), and restarts the killed node, as a new
member, so that the group stays at --nodes. It prints a timeline, and after
--rounds kills a summary of the failover times. Ctrl-C stops early, with the
summary so far.

Exit statuses: 0 done or interrupted; 1 the demo could not run; 2 bad flags.`

type demoCommand struct {
	app      *App
	nodes    int
	rounds   int
	ttl      time.Duration
	interval time.Duration
	verbose  bool
	fs       *pflag.FlagSet
}

func (a *App) newDemoCommand() *cobra.Command {
	c := &demoCommand{app: a}
	cmd := &cobra.Command{
		Use:   "demo [--nodes N] [--rounds R] [--ttl D] [--interval D]",
		Short: "Run a local group, kill its leaders, and show failover",
		Long:  demoLong,
		Args:  noArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			return c.Run(cmd.Context(), args)
		}),
	}
	c.fs = cmd.Flags()
	c.fs.IntVar(&c.nodes, "nodes", 5, "number of nodes, 3 to 9")
	c.fs.IntVar(&c.rounds, "rounds", 6, "number of leaders to kill before stopping")
	c.fs.DurationVar(&c.ttl, "ttl", 3*time.Second, "lease TTL of the nodes (at least "+raft.MinTTL(0).String()+", the shortest raft's timing honours)")
	c.fs.DurationVar(&c.interval, "interval", 3*time.Second, "how long each leader leads before it is killed")
	c.fs.BoolVarP(&c.verbose, "verbose", "v", false, "also show every line of the nodes' output and logs")
	return cmd
}

// Run runs the demo until --rounds kills are done or ctx ends.
func (c *demoCommand) Run(ctx context.Context, _ []string) error {
	var problems []string
	if c.nodes < 3 || c.nodes > 9 {
		problems = append(problems, fmt.Sprintf("--nodes %d: use 3 to 9 (a raft group needs 3 members to survive losing one)", c.nodes))
	}
	if c.rounds < 1 {
		problems = append(problems, fmt.Sprintf("--rounds %d: must be at least 1", c.rounds))
	}
	if c.ttl <= 0 {
		problems = append(problems, fmt.Sprintf("--ttl %s: the TTL must be positive, e.g. --ttl 3s", c.ttl))
	} else if p := raftTTLFloor("--ttl", c.ttl); p != "" {
		problems = append(problems, p)
	}
	if c.interval <= 0 {
		problems = append(problems, fmt.Sprintf("--interval %s: must be positive, e.g. --interval 3s", c.interval))
	}
	if err := problemsError(problems); err != nil {
		return err
	}
	exe, err := c.app.executable()
	if err != nil {
		return fmt.Errorf("cannot find this baton binary to start the nodes: %w", err)
	}
	return demo.Run(ctx, demo.Config{
		Nodes: c.nodes, Rounds: c.rounds, TTL: c.ttl, Interval: c.interval, Verbose: c.verbose,
		Exe: exe, Env: c.app.environ(), Out: c.app.stdout(),
	})
}
