package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

const demoJobLong = `Used by 'baton demo' as the leader-only job of each node: prints
"HOLDER working with token TOKEN" every 500ms (from BATON_HOLDER and BATON_TOKEN)
until SIGTERM.`

type demoJobCommand struct{ app *App }

func (a *App) newDemoJobCommand() *cobra.Command {
	c := &demoJobCommand{app: a}
	return &cobra.Command{
		Use:    "demo-job",
		Short:  "The job 'baton demo' runs on its leader",
		Long:   demoJobLong,
		Hidden: true,
		Args:   noArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			return c.Run(cmd.Context(), args)
		}),
	}
}

// Run prints a line every 500ms until ctx ends.
func (c *demoJobCommand) Run(ctx context.Context, _ []string) error {
	holder, _ := c.app.lookupEnv("BATON_HOLDER")
	token, _ := c.app.lookupEnv("BATON_TOKEN")
	out := c.app.stdout()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := fmt.Fprintf(out, "%s working with token %s\n", holder, token); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(out, "%s stopping (token %s)\n", holder, token)
			return nil
		case <-t.C:
		}
	}
}
