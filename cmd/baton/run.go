package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/batonhq/baton/supervise"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

const runLong = `Run CMD only while this instance holds the lease, and restart it each time
this instance is elected again.

Once elected, baton starts CMD under a guard (baton itself in a hidden mode,
"baton-guard" in ps) in a process group of its own, with the environment
variables BATON_LEASE (the lease), BATON_TOKEN (the fencing token of this term:
pass it with every write to a downstream store, which should reject tokens lower
than the highest it has seen) and BATON_HOLDER (the --id) added. CMD's stdout
and stderr are baton's; its stdin is /dev/null. SIGHUP, SIGUSR1, SIGUSR2,
SIGWINCH and SIGQUIT sent to baton are forwarded to CMD's group.

When the term ends (the lease was lost), CMD and all its descendants get
SIGTERM and, --grace later, SIGKILL; then baton campaigns again. When renewals
lag, baton does not wait for the safe-until deadline: it sends SIGTERM --grace
before it, so that SIGKILL has landed by the time another instance may take
over. --grace must therefore be below the renewal window (--ttl minus its renew
interval and drift margin: at --ttl 10s, 5.67s on raft, 4s on etcd; 2.83s at
raft's default 5s); by default it is half of that, at most 5s. A command that
needs longer to stop needs a longer --ttl.

The guard holds the term's safe-until on its own clock, and baton moves it on
after each renewal. When baton cannot (it hangs, is stopped with SIGSTOP, or
dies, even by kill -9), the guard stops CMD by itself: SIGTERM --grace before
safe-until (at once if baton died), SIGKILL 100ms before it at the latest. It
stops every descendant of CMD, also those that double-forked or called setsid
(the guard is a child subreaper; where cgroup v2 is writable, CMD runs in a
cgroup of its own, killed at once), and exits only when they are all gone. Fence
writes with BATON_TOKEN all the same: a guard stopped together with CMD (a VM
pause) resumes late, and CMD with it.

The guard itself stopped, hung or killed does not free CMD's descendants:
baton waits for a guard that does not answer until 100ms before safe-until,
then kills everything below it, and only then the guard; a guard killed by
another process hands CMD's escaped descendants to baton, a child subreaper,
which kills them. Either way baton releases the lease only once they are all
gone. So that a new term's CMD does not wait for its guard to start, baton
starts the next one ahead of time: an idle "baton-guard" below a standby.

SIGTERM or SIGINT to baton: CMD is stopped the same way, then baton resigns so
that a standby takes over at once, and exits 0. A second SIGTERM/SIGINT kills
baton immediately (the guard then stops CMD within --grace; the lease expires
after --ttl). Closing the backend (ending the session; with raft://, leaving the
group) gets 5s; a close still unfinished 5s after that is logged, with where it
hangs, and baton exits without it.

If CMD exits by itself while this instance leads, baton resigns and campaigns
again (after 1s if CMD ran for less than 1s), unless --once is given.

Exit statuses:
  0  stopped by SIGTERM/SIGINT; with --once, CMD exited 0
  1  runtime error, e.g. CMD could not be started
  2  usage or configuration error
  3  --timeout passed before this instance was elected
  4  --once: the lease was lost while CMD ran (CMD was stopped)
  N  --once: CMD's exit status (128+S if it was killed by signal S); note that
     CMD's own statuses 1-4 are then indistinguishable from baton's

A standby logs who leads whenever that changes ("standing by"). While the
backend cannot be reached it keeps trying and logs a warning ("backend
unreachable" or "campaign failed; retrying") every few seconds.

` + awsHelp + httpHelp + envHelp

// errElectionTimeout is the cause of a run cancelled by --timeout.
var errElectionTimeout = errors.New("not elected within --timeout")

// errLostOnce ends `run --once` when its term ended under a running command.
var errLostOnce = errors.New("the lease was lost while the command ran (--once): the command was stopped")

// leaderFlags are the flags of the commands that run a command while this
// instance leads: run and cron.
type leaderFlags struct {
	app    *App
	common commonFlags
	grace  time.Duration
	fs     *pflag.FlagSet
	raft   raftFlags
	aws    awsFlags
	http   httpFlag
	label  leaderLabelFlag // run only
}

type runCommand struct {
	leaderFlags
	once    bool
	timeout time.Duration
}

func (a *App) newRunCommand() *cobra.Command {
	c := &runCommand{leaderFlags: leaderFlags{app: a}}
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "Run CMD only while this instance holds the lease",
		Long:  runLong,
		Example: `  baton run --backend etcd://10.0.0.5:2379 --lease billing-cron -- ./billing --loop
  BATON_BACKEND=memory:// baton run --lease try -- sh -c 'echo leading with token $BATON_TOKEN; sleep 5'`,
		RunE: wrapRunE(func(cmd *cobra.Command, args []string) error {
			if err := commandAfterDash(cmd, args, "baton run [flags]"); err != nil {
				return err
			}
			return c.Run(cmd.Context(), args)
		}),
	}
	c.fs = cmd.Flags()
	c.common.register(c.fs, "candidate id, unique per process (default HOST/RANDOM); with raft:// the member's ID is this id, then -RANDOM")
	c.fs.DurationVar(&c.grace, "grace", 0, "time between SIGTERM and SIGKILL when stopping CMD; when renewals lag, SIGTERM comes this long before the safe-until deadline so that SIGKILL lands by it (default: half of the renewal window, at most 5s: 2s at --ttl 10s on etcd)")
	c.fs.BoolVar(&c.once, "once", false, "run CMD for one term only, then exit with its status")
	c.fs.DurationVar(&c.timeout, "timeout", 0, "give up (exit 3) if not elected within this time (0: wait forever)")
	withEnv(c.fs, "grace")
	c.raft.register(c.fs)
	c.aws.register(c.fs)
	c.http.register(c.fs, "run")
	c.label.register(c.fs)
	c.common.member = true
	return cmd
}

// validate returns the problems with the flags that run and cron share,
// each saying how to fix it, the parsed backend URL when it is valid, and
// the TTL to open it with (see ttlOrDefault). It sets a default --grace.
func (c *leaderFlags) validate() (problems []string, spec *backendurl.Spec, ttl time.Duration) {
	problems, spec = c.common.validate()
	problems = append(problems, c.http.validate()...)
	if spec != nil && spec.Scheme == "raft" {
		problems = append(problems, c.raft.validate()...)
	} else if spec != nil {
		problems = append(problems, c.raft.validateUnused(spec.Scheme)...)
	}
	problems = append(problems, c.aws.validate()...)
	problems = append(problems, c.label.validate(c.app.lookupEnv)...)
	// The renewal window: how far ahead safe-until stays while renewals are
	// healthy. A grace as long as that would stop every term at once.
	window := time.Duration(0)
	ttl = c.common.ttlOrDefault()
	if spec != nil && c.common.ttl > 0 && (spec.Scheme == "raft" || spec.Scheme == "agent") {
		if p := raftTTLFloor(flagSource(c.fs, "ttl"), ttl); p != "" {
			problems = append(problems, p)
		}
	}
	if spec != nil && c.common.ttl > 0 {
		w, err := spec.RenewalWindow(ttl)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s %s: %v", flagSource(c.fs, "ttl"), spec.TTL(ttl), err))
		}
		window = w
	}
	graceSet := c.fs.Lookup("grace").Changed || flagSource(c.fs, "grace") != "--grace"
	switch {
	case c.grace < 0:
		problems = append(problems, fmt.Sprintf("%s %s: must not be negative; use e.g. --grace 2s (0 kills right after SIGTERM)",
			flagSource(c.fs, "grace"), c.grace))
	case !graceSet && window > 0:
		c.grace = min(5*time.Second, window/2)
	case graceSet && window > 0 && c.grace >= window:
		problems = append(problems, fmt.Sprintf("%s %s: must be below %s (the renewal window at %s: how far ahead safe-until stays), or a child could outlive the term while another instance leads; lower --grace or raise --ttl",
			flagSource(c.fs, "grace"), c.grace, window.Round(time.Millisecond), ttlInForce(c.fs, spec, ttl)))
	}
	return problems, spec, ttl
}

// Run campaigns and runs args as the command while leading, until ctx ends
// or, with --once, the command's term is over.
func (c *runCommand) Run(ctx context.Context, args []string) error {
	problems, spec, ttl := c.validate()
	if c.timeout < 0 {
		problems = append(problems, fmt.Sprintf("--timeout %s: must not be negative; use 0 to wait forever", c.timeout))
	}
	problems = append(problems, checkCommand(args, "baton run --backend URL --lease NAME -- my-server --port 8080")...)
	if err := problemsError(problems); err != nil {
		return err
	}
	return c.lead(ctx, spec, ttl, args, c.once, c.timeout, (*runner).runChild)
}

// checkCommand returns the problem with args, the command to run: that
// there is none (example shows where it goes), or that it cannot be run.
func checkCommand(args []string, example string) []string {
	if len(args) == 0 {
		return []string{"no command to run: put it after --, as in: " + example}
	}
	if _, err := exec.LookPath(args[0]); err != nil {
		return []string{fmt.Sprintf("command %q: %v; check its spelling, PATH and permissions", args[0], unwrapExecError(err))}
	}
	return nil
}

// lead opens the backend and campaigns, running work for each term, until
// ctx ends or, with once, the first term is over. A timeout above zero
// gives up if this instance is not elected within it.
func (c *leaderFlags) lead(ctx context.Context, spec *backendurl.Spec, ttl time.Duration, args []string, once bool, timeout time.Duration, work func(*runner, context.Context, *baton.Elector) error) error {

	log := c.common.logger(c.app.stderr())
	if c.app.Subreaper {
		// baton starts no children but its commands' guards. A platform
		// without a subreaper (macOS) runs the guard's process-group mode,
		// whose gaps docs/guarantees.md states.
		if err := supervise.BecomeSubreaper(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
	}
	// A guard started ahead of each term's command, so that a new term's
	// command does not wait for one; where the streams are not files (an
	// in-process App), each guard starts with its command.
	prepare := supervise.Prepare(nil, c.app.stdout(), c.app.stderr()) == nil
	if prepare {
		defer supervise.Discard()
	}
	// Watching the instance (--aws) ends ctx as SIGTERM would when the
	// instance is leaving; the hand-over ends, after the deferred close of
	// the backend, by completing the lifecycle action.
	ctx, inst, err := c.aws.startAWS(ctx, c.raft.join, log)
	if err != nil {
		return err
	}
	defer inst.finish(ctx)
	id := c.common.id
	if id == "" {
		id = baton.NewCandidateID()
	}
	// A raft member's ID starts with the candidate's, so that logs and
	// status pages link the two.
	c.raft.name = id
	// Serving before connecting: health says 503 until the backend is open.
	hs, err := c.http.start(c.common.lease, id, c.common.backend, &c.raft, log)
	if err != nil {
		return err
	}
	defer hs.close()
	if hs != nil {
		if err := inst.register(hs.reg); err != nil {
			return err
		}
	}
	// --timeout counts from here: connecting (a ZooKeeper session) is part
	// of getting elected.
	start := time.Now()
	octx, ocancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		octx, ocancel = context.WithTimeoutCause(ctx, timeout, errElectionTimeout)
	}
	b, err := c.app.openBackend(octx, spec, ttl, log, &c.raft)
	ocancel()
	if err != nil {
		if errors.Is(context.Cause(octx), errElectionTimeout) && ctx.Err() == nil {
			return &exitError{code: exitUndetermined, err: fmt.Errorf(
				"%w (%s): could not connect to the backend: %w; raise --timeout or use 0 to wait forever", errElectionTimeout, timeout, err)}
		}
		if stoppedBySignal(ctx) {
			// SIGTERM while connecting: nothing ran, nothing to hand over.
			log.Info("stopped before connecting to the backend", "cause", context.Cause(ctx))
			return nil
		}
		return err
	}
	defer closeBackend(ctx, b, log)

	// The backend itself, not the wrapper Open returns (whose embedded
	// interface hides them), so that the Elector sees the optional
	// interfaces it implements: baton.LeaderWatcher and
	// baton.RenewalWindower.
	cfg := baton.ElectorConfig{
		Lease:     c.common.lease,
		Candidate: baton.Candidate{ID: id},
		Logger:    log,
		// SIGKILL must land by safe-until: start stopping CMD a grace early.
		StopEarly: c.grace,
	}
	hs.hooks(&cfg)
	// --leader-label: the pod's label follows the terms, and comes off at
	// once when ctx ends (SIGTERM), before the command has stopped.
	label, err := c.label.start(ctx, spec, c.common.backend, c.app.lookupEnv, log, &cfg)
	if err != nil {
		return err
	}
	if label != nil {
		lctx, lcancel := context.WithCancel(ctx)
		labelled := make(chan struct{})
		go func() { defer close(labelled); _ = label.Run(lctx) }()
		defer func() { lcancel(); <-labelled }()
	}
	e, err := baton.NewElector(inst.backend(b.Backend), cfg)
	if err != nil {
		return err
	}
	hs.attach(b, e)
	r := &runner{
		l:       c,
		timeout: timeout,
		work:    work,
		start:   start,
		args:    args,
		id:      id,
		log:     log.WithGroup("run").With("lease", c.common.lease, "id", id),
	}
	r.child = &supervise.Runner{
		Config: supervise.Config{
			Command: args,
			Env:     c.app.environ(),
			Stdout:  c.app.stdout(),
			Stderr:  c.app.stderr(),
			// supervise reads zero as its default; the CLI documents 0 as
			// "no grace", so pass the smallest positive grace instead.
			Grace:  max(c.grace, time.Nanosecond),
			Logger: log.WithGroup("supervise").With("lease", c.common.lease),
		},
		Holder:  id,
		Once:    once,
		Prepare: prepare,
		Logger:  r.log,
	}
	defer r.child.Close()
	return r.loop(ctx, e)
}

// unwrapExecError drops exec's repetition of the command name.
func unwrapExecError(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}

func closeBackend(ctx context.Context, b *backendurl.Backend, log *slog.Logger) {
	if err := closeWithin(ctx, 5*time.Second, "the backend", log, b.Close); err != nil {
		log.Warn("closing the backend", "err", err)
	}
}

// closeOverrun is how long a close may run past its context's deadline
// before the process stops waiting for it.
const closeOverrun = 5 * time.Second

// closeWithin runs closeFn with a context that ends after d, and waits for it
// at most closeOverrun longer. A close that overruns is logged, with the
// goroutines it is stuck in, and left behind: SIGTERM must end the process
// in bounded time, and by then the work has stopped and its lease was
// released (or expires with its session).
func closeWithin(ctx context.Context, d time.Duration, what string, log *slog.Logger, closeFn func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- closeFn(cctx) }()
	select {
	case err := <-done:
		return err
	case <-cctx.Done():
	}
	t := time.NewTimer(closeOverrun)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	var stacks strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2) // as a SIGQUIT prints them
	log.Warn("closing "+what+" did not finish; exiting without waiting for it",
		"waited", d+closeOverrun, "goroutines", stacks.String())
	return nil
}

// runner is one `baton run` or `baton cron`.
type runner struct {
	l       *leaderFlags
	timeout time.Duration // --timeout
	// work runs the terms of e: the command (runChild), or cron's
	// schedule.
	work  func(r *runner, ctx context.Context, e *baton.Elector) error
	child *supervise.Runner // the command, started for each term or slot
	args  []string
	id    string
	log   *slog.Logger

	// start is when --timeout began to count.
	start time.Time

	// electedOnce is closed when the first term starts, which disarms
	// --timeout.
	electedOnce sync.Once
	elected     chan struct{}

	// terms counts the commands started, for brokenStaleToken.
	terms atomic.Int64
}

func (r *runner) loop(ctx context.Context, e *baton.Elector) error {
	ctx, cancel := context.WithCancelCause(ctx)
	r.elected = make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.timeout > 0 {
		wg.Go(func() {
			t := time.NewTimer(r.timeout - time.Since(r.start))
			defer t.Stop()
			select {
			case <-t.C:
				cancel(errElectionTimeout)
			case <-r.elected:
			case <-ctx.Done():
			}
		})
	}
	// Signals that would be forwarded to the command must not kill a
	// standby (SIGHUP's default action) while no command runs.
	wg.Go(func() { r.ignoreForwardedSignals(ctx) })
	wg.Go(func() { r.reportStandby(ctx, e) })
	defer cancel(nil) // runs before wg.Wait

	r.log.Info("campaigning", "backend", redactURL(r.l.common.backend), "command", r.args)
	err := r.work(r, ctx, e)
	var exited *supervise.ExitError
	switch {
	case errors.As(err, &exited): // --once: the command exited by itself
		if exited.Code == 0 {
			return nil
		}
		if exited.Code < 0 {
			// No status: the command's guard died without reporting one.
			return &exitError{code: exitFailure, err: errors.New("the command's guard died before reporting the command's exit status (see the log above)")}
		}
		return &exitError{code: exited.Code}
	case errors.Is(err, supervise.ErrTermEnded):
		return &exitError{code: exitLost, err: errLostOnce}
	case ctx.Err() != nil:
		cause := context.Cause(ctx)
		if errors.Is(cause, errElectionTimeout) {
			return &exitError{code: exitUndetermined, err: fmt.Errorf(
				"%w (%s): another instance holds lease %q, or the backend is unreachable; raise --timeout or use 0 to wait forever",
				errElectionTimeout, r.timeout, r.l.common.lease)}
		}
		if stoppedBySignal(ctx) {
			r.log.Info("stopped", "cause", cause)
			return nil
		}
		return cause
	default:
		return err
	}
}

// standbyPeriods time reportStandby. Zero fields mean the defaults.
type standbyPeriods struct {
	// settle is how long a new run waits before it reports anything, so
	// that an uncontested campaign wins first (default 1 s).
	settle time.Duration
	// firstAnswer is how long a standby waits for the first word of who
	// leads before it warns that the backend does not answer (default 2 s).
	firstAnswer time.Duration
	// warnEvery is the least time between two warnings that the backend
	// cannot be reached (default 5 s).
	warnEvery time.Duration
}

// orDefaults returns p with its zero fields set to the defaults.
func (p standbyPeriods) orDefaults() standbyPeriods {
	if p.settle <= 0 {
		p.settle = time.Second
	}
	if p.firstAnswer <= 0 {
		p.firstAnswer = 2 * time.Second
	}
	if p.warnEvery <= 0 {
		p.warnEvery = 5 * time.Second
	}
	return p
}

// reportStandby logs, while this instance does not lead, who does, each time
// that changes, and warns (at most every warnEvery) while the backend
// cannot be reached. Who leads comes from Elector.WatchLeader: pushed by
// the backend as it changes where the backend can (etcd, ZooKeeper, Consul),
// asked for every few seconds otherwise, and then only while this instance
// does not lead. A campaign that cannot reach the backend is reported by the
// Elector too ("campaign failed; retrying").
func (r *runner) reportStandby(ctx context.Context, e *baton.Elector) {
	p := r.l.app.standby.orDefaults()
	t := time.NewTimer(p.settle)
	select {
	case <-ctx.Done():
		t.Stop()
		return
	case <-t.C:
	}
	type answer struct {
		rec baton.Record
		err error
	}
	// The watch's latest answer; an older one not yet taken is replaced.
	answers := make(chan answer, 1)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.WatchLeader(wctx, func(rec baton.Record, err error) {
			for {
				select {
				case answers <- answer{rec, err}:
					return
				default:
				}
				select {
				case <-answers:
				default:
				}
			}
		})
	}()
	defer func() { cancel(); <-done }()

	t.Reset(p.firstAnswer)
	defer t.Stop()
	last := ""
	var warned time.Time
	warn := func(msg string, args ...any) {
		last = ""
		if time.Since(warned) < p.warnEvery {
			return
		}
		warned = time.Now()
		r.log.Warn(msg, append([]any{"backend", redactURL(r.l.common.backend)}, args...)...)
	}
	answered := false
	for {
		var a answer
		select {
		case <-ctx.Done():
			return
		case <-done:
			return // the backend was closed
		case <-t.C:
			if e.Status().Leader {
				// The backend confirms this instance's term, so it
				// answers; the watch asks nobody who leads while this
				// instance leads itself (memory://, agent://), so its
				// silence says nothing. Once the term ends, the watch
				// asks again and reports any failure to answer.
				answered = true
			}
			if !answered {
				warn("backend unreachable: no answer; still campaigning", "waited", p.firstAnswer)
				t.Reset(p.warnEvery)
			}
			continue
		case a = <-answers:
			answered = true
			t.Stop()
		}
		var state string
		switch {
		case e.Status().Leader:
			last = ""
			continue
		case errors.Is(a.err, baton.ErrNoLeader):
			state = "nobody"
		case errors.Is(a.err, context.DeadlineExceeded):
			warn("backend unreachable: no answer; still campaigning", "waited", p.firstAnswer)
			continue
		case a.err != nil:
			warn("backend unreachable; still campaigning", "err", a.err)
			continue
		case a.rec.Holder == r.id:
			continue // elected meanwhile
		default:
			state = fmt.Sprintf("%s (token %d)", a.rec.Holder, a.rec.Token)
		}
		if state != last {
			r.log.Info("standing by", "leader", state)
			last = state
		}
	}
}

// ignoreForwardedSignals swallows the forwarded signals while no command
// runs; while one runs, Process.Forward relays them too.
func (r *runner) ignoreForwardedSignals(ctx context.Context) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, supervise.DefaultForwardSignals()...)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-ch:
			r.log.Debug("received signal", "signal", sig)
		}
	}
}

// runChild runs the command for each term of e (supervise.Runner.Run):
// restarted when it exits by itself, unless --once.
func (r *runner) runChild(ctx context.Context, e *baton.Elector) error {
	return r.child.Run(ctx, termsOf{e, r})
}

// termsOf is e as the runner's supervise.Runner sees it: each term
// disarms --timeout and is seen through view.
type termsOf struct {
	e *baton.Elector
	r *runner
}

func (te termsOf) Run(ctx context.Context, fn func(context.Context, baton.Term) error) error {
	return te.e.Run(ctx, func(ctx context.Context, t baton.Term) error {
		te.r.electedOnce.Do(func() { close(te.r.elected) })
		return fn(ctx, te.r.view(t))
	})
}

// view is t as a command started for it sees it: t itself, except in the
// deliberately broken builds (broken.go).
func (r *runner) view(t baton.Term) baton.Term {
	if n := r.terms.Add(1); brokenStaleToken && n%2 == 0 && t.Token() > 1<<32 {
		t = staleTerm{t}
	}
	if brokenIgnoreDeadline {
		t = lateTerm{t}
	}
	return t
}

// staleTerm is a term whose token is from an earlier epoch: the command's
// view of every second term in a build with brokenStaleToken.
type staleTerm struct{ baton.Term }

func (t staleTerm) Token() uint64 { return t.Term.Token() - 1<<32 }

// lateTerm is a term whose safe-until is an hour late: the guard's view of
// the term in a build with brokenIgnoreDeadline.
type lateTerm struct{ baton.Term }

func (t lateTerm) SafeUntil() time.Time { return t.Term.SafeUntil().Add(time.Hour) }
