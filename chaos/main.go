// Command baton-chaos is baton's fault harness: it starts a real backend
// and N `baton run` candidates whose leader-only job writes to a fenced
// store, injects faults at random times from a seed (kill -9, SIGSTOP of
// baton alone or of its whole process tree, SIGTERM, network cuts, added
// latency, backend restarts, raft leader and quorum loss, CPU hogs and
// short stalls), then checks the
// store's history for fencing violations, overlapping leaders, token
// regressions and availability, and writes a report (JSON and an SVG
// timeline).
//
//	go run ./chaos --backend etcd --faults 30 --seed 1
//
// Exit status: 0 the run passed its checks; 1 it failed them (the report
// says which); 2 bad flags; 3 the run could not be carried out (a backend
// that did not start, no first leader).
package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/batonhq/baton/chaos/internal/check"
	"github.com/batonhq/baton/chaos/internal/harness"
	"github.com/batonhq/baton/chaos/internal/record"
	"github.com/batonhq/baton/chaos/internal/store"
	"github.com/spf13/cobra"
)

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
	exitRun    = 3
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		os.Exit(harness.ChildMain(os.Args[2:], os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// codeError carries an exit status.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ce *codeError
	if errors.As(err, &ce) {
		if ce.err != nil && ce.code != exitFailed {
			fmt.Fprintf(stderr, "baton-chaos: %v\n", ce.err)
		}
		return ce.code
	}
	// cobra's own errors: unknown flags, bad values.
	fmt.Fprintf(stderr, "baton-chaos: %v\n", err)
	return exitUsage
}

type options struct {
	cfg             harness.Config
	kinds           string
	wipe            bool
	dir             string
	minAvailability float64
	seedSet         bool
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "baton-chaos --backend NAME [flags]",
		Short: "Inject faults into baton candidates on a real backend and check that two never lead at once",
		Long: `baton-chaos starts a real backend and N baton run candidates (the real
binary) whose leader-only job writes to a fenced store served by the harness:
every write carries BATON_TOKEN, and the store refuses a token lower than the
highest it has accepted. A nemesis injects faults at random times drawn from
--seed. The checker then reads the store's history and reports fencing
violations, overlapping leaders, token regressions, availability outside fault
windows and the time to recover after each kind of fault.

Fault kinds (--kinds): kill, term, stop-baton, stop-tree, cut, hog (a CPU hog:
2 busy processes per core for 1-3 x TTL), stall (SIGSTOP of the holder's baton,
its guard or both, or on raft of the raft leader's member, for 100 ms-1 s),
slow (not raft), restart, wipe (opt-in: restart without data, also --wipe),
raft-leader and raft-quorum (raft only), server-kill and server-cut
(zookeeper-ensemble only), failover (redis-sentinel only: a primary, a replica
and three sentinels; a Sentinel failover, at times with the replication link
cut first so that writes are really lost; no cut or slow there, as the
candidates dial the servers the sentinels name). See docs/reliability.md.

The run's directory keeps report.json, timeline.svg (the whole run),
timeline-start.svg (its first minute), history.json.gz (every write and fault;
'baton-chaos check DIR' checks it again), writes.jsonl (the writes, streamed:
what a run that died leaves) and the candidates' logs.

Exit status: 0 passed; 1 failed its checks; 2 bad flags; 3 the run could not
be carried out.`,
		Example: `  go run ./chaos --backend etcd --faults 30 --seed 1
  go run ./chaos --backend postgres --pgbouncer --wipe --faults 100
  go run ./chaos --backend redis-sentinel --faults 1000 --ttl 6s
  go run ./chaos --backend raft --faults 1000 --interval 1.5s --seed 7 --min-availability 0.999
  go run ./chaos --backend etcd --broken ignore-deadline --kinds stop-baton --faults 5`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.seedSet = cmd.Flags().Changed("seed")
			return o.run(cmd.Context(), stdout, stderr)
		},
	}
	fs := root.Flags()
	fs.StringVar(&o.cfg.Backend, "backend", "", "backend: "+strings.Join(harness.Backends, ", ")+" (required)")
	fs.BoolVar(&o.cfg.PgBouncer, "pgbouncer", false, "postgres only: the candidates go through a real PgBouncer in transaction-pooling mode (waiters poll)")
	fs.IntVar(&o.cfg.Candidates, "candidates", 3, "number of baton run candidates")
	fs.IntVar(&o.cfg.Turns, "turns", 1, "candidates per process: above 1, each process is one Backend with this many Electors taking turns (consul, redis, postgres; no stop-baton or stall: there is no guard)")
	fs.DurationVar(&o.cfg.TermMax, "term-max", 0, "with --turns: a term's work returns after a random time up to this (default 4 x --ttl)")
	fs.IntVar(&o.cfg.Faults, "faults", 30, "number of faults to inject")
	fs.DurationVar(&o.cfg.Interval, "interval", 2*time.Second, "mean time between injections (exponentially distributed)")
	fs.IntVar(&o.cfg.MaxActive, "max-active", 2, "at most this many faults in force at once")
	fs.StringVar(&o.kinds, "kinds", "", "comma-separated fault kinds (default: every kind the backend takes but wipe)")
	fs.BoolVar(&o.wipe, "wipe", false, "also inject wipe: a backend restart without its data")
	fs.DurationVar(&o.cfg.TTL, "ttl", 3*time.Second, "the candidates' --ttl")
	fs.DurationVar(&o.cfg.Grace, "grace", 0, "the candidates' --grace (0: baton's default)")
	fs.DurationVar(&o.cfg.Heartbeat, "heartbeat", 20*time.Millisecond, "how often the leader-only job writes")
	fs.Int64Var(&o.cfg.Seed, "seed", 0, "seed of the fault schedule (default: from the clock, printed)")
	fs.StringVar(&o.cfg.Broken, "broken", "", "run a deliberately broken baton build: ignore-deadline or stale-token (the check must fail)")
	fs.StringVar(&o.cfg.Baton, "baton", "", "baton binary to test (default: built from this repository)")
	fs.StringVar(&o.dir, "dir", "", "run directory, kept (default: a new one under $TMPDIR)")
	fs.Float64Var(&o.minAvailability, "min-availability", 0, "fail if availability outside fault windows is below this fraction, e.g. 0.999 (0: report only)")
	root.AddCommand(newCheck(stdout))
	return root
}

func (o *options) run(ctx context.Context, stdout, stderr io.Writer) error {
	if o.cfg.Backend == "" {
		return &codeError{exitUsage, fmt.Errorf("--backend is required: one of %s", strings.Join(harness.Backends, ", "))}
	}
	if !o.seedSet {
		o.cfg.Seed = time.Now().UnixNano() % 1_000_000
	}
	if o.kinds != "" {
		o.cfg.Kinds = strings.Split(o.kinds, ",")
	}
	if o.wipe {
		if len(o.cfg.Kinds) == 0 {
			o.cfg.Kinds = harness.DefaultKinds(o.cfg.Backend)
			if o.cfg.Turns > 1 {
				o.cfg.Kinds = harness.TurnsKinds(o.cfg.Kinds)
			}
		}
		o.cfg.Kinds = append(o.cfg.Kinds, harness.KindWipe)
	}
	if o.minAvailability < 0 || o.minAvailability > 1 {
		return &codeError{exitUsage, fmt.Errorf("--min-availability %v: want a fraction from 0 to 1, e.g. 0.999", o.minAvailability)}
	}
	exe, err := os.Executable()
	if err != nil {
		return &codeError{exitRun, err}
	}
	o.cfg.Child = []string{exe, "child"}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "baton-chaos-"+o.cfg.Backend+"-"); err != nil {
			return &codeError{exitRun, err}
		}
	} else if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return &codeError{exitUsage, fmt.Errorf("--dir: %w", err)}
	}
	o.cfg.Dir = o.dir
	o.cfg.Command = o.command()
	if err := o.cfg.WithDefaults().Validate(); err != nil {
		return &codeError{exitUsage, err}
	}
	o.cfg.Log = slog.New(slog.NewTextHandler(stderr, nil))
	o.cfg.Log.Info("chaos run", "backend", o.cfg.Backend, "seed", o.cfg.Seed, "faults", o.cfg.Faults, "dir", o.dir)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first ^C the run winds down (stops its candidates, writes
	// its report); a second one ends the harness at once, and the
	// candidates with it.
	go func() { <-ctx.Done(); stop() }()
	hist, runErr := harness.Run(ctx, o.cfg)
	if err := writeHistory(filepath.Join(o.dir, "history.json.gz"), hist); err != nil {
		o.cfg.Log.Warn("could not save the history", "err", err)
	}
	if runErr != nil && len(hist.Writes) == 0 {
		return &codeError{exitRun, runErr}
	}
	rep, err := report(o.dir, hist, o.minAvailability, stdout)
	if err != nil {
		return &codeError{exitRun, err}
	}
	if runErr != nil {
		return &codeError{exitRun, fmt.Errorf("the run stopped early (its report covers what it recorded): %w", runErr)}
	}
	if !rep.OK() {
		return &codeError{exitFailed, nil}
	}
	return nil
}

// command returns the command line that reproduces the run.
func (o *options) command() string {
	c := o.cfg
	parts := []string{"go run ./chaos", "--backend", c.Backend}
	if c.PgBouncer {
		parts = append(parts, "--pgbouncer")
	}
	parts = append(parts, "--seed", fmt.Sprint(c.Seed),
		"--faults", fmt.Sprint(c.Faults), "--interval", c.Interval.String(), "--max-active", fmt.Sprint(c.MaxActive),
		"--candidates", fmt.Sprint(c.Candidates), "--ttl", c.TTL.String(), "--heartbeat", c.Heartbeat.String())
	if c.Grace > 0 {
		parts = append(parts, "--grace", c.Grace.String())
	}
	if c.Turns > 1 {
		parts = append(parts, "--turns", fmt.Sprint(c.Turns))
		if c.TermMax > 0 {
			parts = append(parts, "--term-max", c.TermMax.String())
		}
	}
	if o.kinds != "" {
		parts = append(parts, "--kinds", o.kinds)
	}
	if o.wipe {
		parts = append(parts, "--wipe")
	}
	if c.Broken != "" {
		parts = append(parts, "--broken", c.Broken)
	}
	if o.minAvailability > 0 {
		parts = append(parts, "--min-availability", fmt.Sprint(o.minAvailability))
	}
	return strings.Join(parts, " ")
}

// report checks hist and writes report.json, timeline.svg and
// timeline-start.svg into dir, and a summary to w.
func report(dir string, hist record.History, minAvailability float64, w io.Writer) (check.Report, error) {
	rep := check.Check(hist)
	rep.MinAvailability = minAvailability
	if err := writeFile(filepath.Join(dir, "report.json"), func(f io.Writer) error { return check.WriteJSON(f, rep) }); err != nil {
		return rep, err
	}
	if err := writeFile(filepath.Join(dir, "timeline.svg"), func(f io.Writer) error {
		return check.WriteSVG(f, hist, rep, check.SVGOptions{})
	}); err != nil {
		return rep, err
	}
	if err := writeFile(filepath.Join(dir, "timeline-start.svg"), func(f io.Writer) error {
		return check.WriteSVG(f, hist, rep, check.SVGOptions{To: time.Minute})
	}); err != nil {
		return rep, err
	}
	writeSummary(w, rep)
	fmt.Fprintf(w, "report: %s\ntimeline: %s\n", filepath.Join(dir, "report.json"), filepath.Join(dir, "timeline.svg"))
	return rep, nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeHistory(path string, hist record.History) error {
	return writeFile(path, func(f io.Writer) error {
		zw := gzip.NewWriter(f)
		if err := json.NewEncoder(zw).Encode(hist); err != nil {
			return err
		}
		return zw.Close()
	})
}

func readHistory(path string) (record.History, error) {
	var hist record.History
	f, err := os.Open(path)
	if err != nil {
		return hist, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return hist, fmt.Errorf("%s: %w", path, err)
	}
	if err := json.NewDecoder(zr).Decode(&hist); err != nil {
		return hist, fmt.Errorf("%s: %w", path, err)
	}
	return hist, nil
}

// readWrites reads the store's stream of writes, for a run that left no
// history.
func readWrites(path string) (record.History, error) {
	var hist record.History
	f, err := os.Open(path)
	if err != nil {
		return hist, err
	}
	defer f.Close()
	hist.Writes, err = store.ReadLog(f)
	if err != nil {
		return hist, fmt.Errorf("%s: %w", path, err)
	}
	return hist, nil
}

func newCheck(stdout io.Writer) *cobra.Command {
	var minAvailability float64
	cmd := &cobra.Command{
		Use:   "check DIR",
		Short: "Check a saved run again (its history.json.gz, or the writes.jsonl of a run that died) and rewrite its report",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			hist, err := readHistory(filepath.Join(args[0], "history.json.gz"))
			if errors.Is(err, os.ErrNotExist) {
				// A harness that died leaves only the store's stream: the
				// writes can still be checked, without the faults.
				hist, err = readWrites(filepath.Join(args[0], "writes.jsonl"))
				if err == nil {
					fmt.Fprintln(stdout, "no history.json.gz (the run did not finish): checking writes.jsonl, without the faults")
				}
			}
			if err != nil {
				return &codeError{exitUsage, err}
			}
			rep, err := report(args[0], hist, minAvailability, stdout)
			if err != nil {
				return &codeError{exitRun, err}
			}
			if !rep.OK() {
				return &codeError{exitFailed, nil}
			}
			return nil
		},
	}
	cmd.Flags().Float64Var(&minAvailability, "min-availability", 0, "fail if availability outside fault windows is below this fraction")
	return cmd
}
