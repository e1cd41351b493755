package harness

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/batonhq/baton/chaos/internal/store"
	"github.com/batonhq/baton/chaos/internal/turns"
)

// ChildMain is the leader-only job of a chaos run's candidates: `child
// --store SOCKET --candidate ID --every D`. It writes to the fenced store
// every D with BATON_TOKEN, the term's token, until SIGTERM or SIGINT,
// and returns the process's exit code: 0 when stopped by a signal, 2 for
// bad arguments. `child turns ARGS` is instead a candidate process with
// several candidates (Config.Turns): see turns.Main.
func ChildMain(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "turns" {
		return turns.Main(args[1:], stderr)
	}
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sock := fs.String("store", "", "the fenced store's Unix socket")
	id := fs.String("candidate", "", "the candidate's id")
	every := fs.Duration("every", 20*time.Millisecond, "time between writes")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	token, err := strconv.ParseUint(os.Getenv("BATON_TOKEN"), 10, 64)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "child: BATON_TOKEN %q is not a token: run it under `baton run`\n", os.Getenv("BATON_TOKEN"))
		return 2
	case *sock == "" || *id == "":
		fmt.Fprintln(stderr, "child: --store and --candidate are required")
		return 2
	case *every <= 0:
		fmt.Fprintln(stderr, "child: --every must be positive")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c := store.Child{Socket: *sock, Candidate: *id, Token: token, Every: *every}
	if err := c.Run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "child: %v\n", err)
		return 1
	}
	return 0
}
