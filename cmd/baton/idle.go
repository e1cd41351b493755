package main

import (
	"context"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

const idleLong = `Do nothing until SIGTERM or SIGINT, then exit 0.

The command for a baton run that only holds the lease while the program runs
beside it, as in a Kubernetes sidecar whose program asks baton's
/v1/health/leader before leader-only work:

  baton run --backend k8s://NAMESPACE --lease NAME --http 0.0.0.0:8080 -- baton idle

It lasts the term: baton's guard stops it with SIGTERM when the term ends. It
needs nothing but baton itself, so it runs in the release image, which has no
shell and no sleep. The other signals that baton run forwards to its command
(SIGHUP, SIGUSR1, SIGUSR2, SIGWINCH, SIGQUIT) are ignored: only the end of the
term ends it, since a command that exits makes baton run resign.

Exit statuses: 0 stopped by SIGTERM or SIGINT; 2 usage (an argument given).`

// idleCommand waits for the signal that ends it.
type idleCommand struct{ app *App }

func (a *App) newIdleCommand() *cobra.Command {
	c := &idleCommand{app: a}
	return &cobra.Command{
		Use:   "idle",
		Short: "Do nothing until SIGTERM: the command of a sidecar's baton run",
		Long:  idleLong,
		Args:  noArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			return c.Run(cmd.Context(), args)
		}),
	}
}

// Run waits until ctx ends (main ends it at SIGTERM or SIGINT). The other
// signals baton run forwards to its command are ignored, since their
// default action would end the process, and a command that exits makes
// baton run resign. Ignored, not caught: SIG_IGN shows in
// /proc/PID/status (SigIgn), which is how a test tells that idle is ready.
func (c *idleCommand) Run(ctx context.Context, _ []string) error {
	signal.Ignore(syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGQUIT)
	<-ctx.Done()
	return nil
}
