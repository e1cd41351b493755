package main

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/schedule"
	"github.com/robfig/cron/v3"
	"github.com/spf13/cobra"
)

const cronLong = `Run CMD on a cron schedule, on the leader only, at most once per slot across
the whole group, even across a failover.

A slot is one scheduled time of the job. Before the leader starts CMD for a
slot, it records the slot under the lease; the backend accepts that write only
while this instance still holds the lease, so a replaced leader cannot claim a
slot. A new leader reads the record: it never runs a slot again that its
predecessor claimed, even if that one died mid-run (the slot is then logged,
not repeated: at most once, not exactly once).

Slots missed while nobody led, or while the previous run was still going, are
handled by --catch-up: "last" (the default) runs the latest missed slot at once
and passes over earlier ones; "none" passes over them all and waits for the
next slot. Runs never overlap: the next slot waits for the current run.

--schedule takes robfig/cron specs: five fields (minute hour day-of-month month
day-of-week), optionally a leading seconds field, descriptors (@hourly, @daily,
@every 15m), and a CRON_TZ=Zone prefix (default: the local zone):
  "0 3 * * *"                       03:00 every day
  "CRON_TZ=Europe/Berlin 30 6 * * 1-5"  06:30 Berlin time on weekdays
  "*/10 * * * * *"                  every 10 seconds

CMD gets BATON_LEASE, BATON_HOLDER, BATON_TOKEN (the fencing token of the term
that claimed the slot: pass it with downstream writes), BATON_JOB and
BATON_SLOT (the slot's scheduled time, RFC 3339). CMD runs under a guard like
baton run's command: a run that outlives the term, or whose baton hangs or
dies, is stopped with all its descendants (SIGTERM, then SIGKILL --grace later,
landing before safe-until). A failed run (non-zero exit) is logged and not
retried.

Slots follow the schedule's zone: where it has daylight saving time, a daily
01:30 falls twice on the autumn change and a 02:30 not at all in spring; use
CRON_TZ=UTC where that matters. --jitter must be shorter than the gap between
two slots.

SIGTERM or SIGINT: a running CMD is stopped, baton resigns and exits 0.

Exit statuses:
  0  stopped by SIGTERM/SIGINT
  1  runtime error (e.g. the lease's record belongs to another job)
  2  usage or configuration error

` + awsHelp + httpHelp + envHelp

type cronCommand struct {
	leaderFlags
	spec    string
	catchUp string
	jitter  time.Duration
	job     string

	sched cron.Schedule
	mode  schedule.CatchUp
}

func (a *App) newCronCommand() *cobra.Command {
	c := &cronCommand{leaderFlags: leaderFlags{app: a}}
	cmd := &cobra.Command{
		Use:   "cron --schedule SPEC [flags] -- CMD [ARGS...]",
		Short: "Run CMD on a cron schedule, on the leader only, once per slot",
		Long:  cronLong,
		Example: `  baton cron --backend etcd://10.0.0.5:2379 --lease reminders \
      --schedule "CRON_TZ=Europe/Berlin 0 9 */3 * *" --jitter 30s -- ./send-reminders
  BATON_BACKEND=memory:// baton cron --lease try --schedule "*/5 * * * * *" -- sh -c 'echo slot $BATON_SLOT token $BATON_TOKEN'`,
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			if err := commandAfterDash(cmd, args, "baton cron --schedule SPEC [flags]"); err != nil {
				return err
			}
			return c.Run(cmd.Context(), args)
		}),
	}
	c.fs = cmd.Flags()
	c.common.register(c.fs, "candidate id, unique per process (default HOST/RANDOM); with raft:// the member's ID is this id, then -RANDOM")
	c.fs.DurationVar(&c.grace, "grace", 0, "time between SIGTERM and SIGKILL when stopping a run whose term ended (default: half of the renewal window, at most 5s)")
	c.fs.StringVar(&c.spec, "schedule", "", `cron spec, e.g. "0 3 * * *" or "CRON_TZ=UTC */30 * * * * *" (required)`)
	c.fs.StringVar(&c.catchUp, "catch-up", "last", "missed slots after a failover or a long run: last (run the latest at once) or none (wait for the next)")
	c.fs.DurationVar(&c.jitter, "jitter", 0, "delay each run by a random time below this (0: none)")
	c.fs.StringVar(&c.job, "job", "", "job name recorded with each slot (default: the lease name)")
	withEnv(c.fs, "grace", "schedule", "catch-up", "jitter", "job")
	c.raft.register(c.fs)
	c.aws.register(c.fs)
	c.http.register(c.fs, "cron")
	c.common.member = true
	return cmd
}

// Run campaigns and runs the schedule while leading, until ctx ends.
func (c *cronCommand) Run(ctx context.Context, args []string) error {
	problems, spec, ttl := c.validate()
	if c.spec == "" {
		problems = append(problems, `--schedule is required: a cron spec such as "0 3 * * *" (03:00 daily) or "*/10 * * * * *" (every 10 seconds)`)
	} else if s, err := schedule.Parse(c.spec); err != nil {
		problems = append(problems, fmt.Sprintf("%s: %v", flagSource(c.fs, "schedule"), err))
	} else {
		c.sched = s
	}
	if m, err := schedule.ParseCatchUp(c.catchUp); err != nil {
		problems = append(problems, fmt.Sprintf("%s: %v", flagSource(c.fs, "catch-up"), err))
	} else {
		c.mode = m
	}
	if c.jitter < 0 {
		problems = append(problems, fmt.Sprintf("%s %s: must not be negative; use 0 for no jitter", flagSource(c.fs, "jitter"), c.jitter))
	} else if c.sched != nil {
		if err := schedule.CheckJitter(c.sched, c.jitter); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", flagSource(c.fs, "jitter"), err))
		}
	}
	if c.job == "" {
		c.job = c.common.lease
	}
	problems = append(problems, checkCommand(args, `baton cron --backend URL --lease NAME --schedule "0 3 * * *" -- ./backup.sh`)...)
	if err := problemsError(problems); err != nil {
		return err
	}
	return c.lead(ctx, spec, ttl, args, false, 0, c.leadCron)
}

// leadCron runs the schedule for each term of e.
func (c *cronCommand) leadCron(r *runner, ctx context.Context, e *baton.Elector) error {
	return e.Run(ctx, func(ctx context.Context, t baton.Term) error {
		r.electedOnce.Do(func() { close(r.elected) })
		if ctx.Err() != nil {
			// --timeout fired just as we were elected, or we are stopping.
			return nil
		}
		job := &schedule.Job{
			Name:      c.job,
			Schedule:  c.sched,
			CatchUp:   c.mode,
			Jitter:    c.jitter,
			Candidate: r.id,
			Logger:    r.log.WithGroup("cron"),
			Run:       func(ctx context.Context, s schedule.Slot) error { return r.runSlot(ctx, t, s) },
		}
		return job.Lead(ctx, t)
	})
}

// runSlot runs the command for one slot and waits for it; when ctx ends
// first (the term is ending), it stops the command by safe-until.
func (r *runner) runSlot(ctx context.Context, t baton.Term, s schedule.Slot) error {
	if err := ctx.Err(); err != nil {
		return err // stopping: don't start what would be stopped at once
	}
	p, err := r.child.Start(r.view(t), []string{"BATON_JOB=" + s.Job, "BATON_SLOT=" + s.String()}, "slot", s.String())
	if err != nil {
		return fmt.Errorf("the command could not be started: %w", err)
	}
	defer p.Close()
	if p.Wait(ctx) {
		r.child.End(p)
		if code := p.ExitCode(); code != 0 {
			return fmt.Errorf("command exited with status %d", code)
		}
		return nil
	}
	r.child.End(p)
	reason := p.Reason(ctx)
	r.log.Warn("term ended during a run; the command was stopped", "slot", s.String(), "exit_code", p.ExitCode(), "reason", reason)
	if err := ctx.Err(); err != nil {
		return err
	}
	return reason
}
