package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/aws"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
)

// awsHelp is the part of the help of run, cron and agent about --aws.
const awsHelp = `On an EC2 instance of an Auto Scaling group (--aws; implied by the other --aws-*
flags and by --join aws-asg, which only warns on an instance outside any group),
baton watches the instance's metadata (IMDSv2) every second. When the group
terminates the instance (target lifecycle state Terminated) or EC2 sends a spot
interruption notice (with --aws-rebalance, a rebalance recommendation too),
baton does what SIGTERM does, logging the reason ("instance terminating", "spot
interruption", "rebalance recommendation"): the work stops, the lease is
released so that a standby takes over at once, a raft member leaves the group,
and baton exits 0. With --aws-lifecycle-hook NAME it heartbeats the hook
meanwhile and then completes its action (CONTINUE), so that the group terminates
the instance without waiting out the hook's timeout. With run and cron, an
instance that is not InService (Pending, Standby, Terminating...) does not
campaign, one that leaves InService stops its work and resigns, and --aws-tag
KEY[=VALUE] tags the instance KEY=VALUE and KEY-token=TOKEN while it holds the
lease (docs/aws.md says what a reader of the tag can rely on). Region and
credentials come from the AWS_* variables, the shared config and the instance
profile.

`

// awsFlags are the flags of the commands that hand over before the Auto
// Scaling group takes the instance away: run, cron and agent.
type awsFlags struct {
	enabled   bool   // --aws
	hook      string // --aws-lifecycle-hook
	rebalance bool   // --aws-rebalance
	tag       string // --aws-tag KEY[=VALUE]

	tagKey, tagValue string // parsed --aws-tag
	fs               *pflag.FlagSet
}

func (f *awsFlags) register(fs *pflag.FlagSet) {
	f.fs = fs
	fs.BoolVar(&f.enabled, "aws", false, "on an EC2 instance of an Auto Scaling group: hand over as on SIGTERM when the group terminates the instance or EC2 sends a spot interruption notice, and campaign only while the instance is InService (implied by the other --aws-* flags; also by --join aws-asg, where an instance outside any group only gets a warning)")
	fs.StringVar(&f.hook, "aws-lifecycle-hook", "", "the group's termination lifecycle hook: once the hand-over is done, complete its action (CONTINUE) so that the group terminates the instance at once; heartbeat it meanwhile")
	fs.BoolVar(&f.rebalance, "aws-rebalance", false, "hand over on a spot rebalance recommendation too, not only on an interruption notice")
	fs.StringVar(&f.tag, "aws-tag", "", "tag this instance KEY=VALUE (VALUE defaults to true) and KEY-token=TOKEN while it holds the lease, after removing KEY from the group's other instances; removed when the term ends (run and cron only; for readers of the tag: baton is-leader gives the exact answer)")
	withEnv(fs, "aws", "aws-lifecycle-hook", "aws-rebalance", "aws-tag")
}

// hookNamePattern is Auto Scaling's pattern for a lifecycle hook name.
var hookNamePattern = regexp.MustCompile(`^[A-Za-z0-9\-_/]{1,255}$`)

// active reports whether the instance is watched: --aws, another --aws-*
// flag, or --join aws-asg (a member found through the group is on one of
// its instances).
func (f *awsFlags) active(join string) bool {
	return f.enabled || f.hook != "" || f.rebalance || f.tag != "" || joinsASG(join)
}

// joinsASG reports whether a --join spec is aws-asg[:GROUP].
func joinsASG(join string) bool {
	s := strings.ToLower(strings.TrimSpace(join))
	return s == "aws-asg" || strings.HasPrefix(s, "aws-asg:")
}

// validate returns the problems with the --aws-* flags.
func (f *awsFlags) validate() []string {
	var problems []string
	if f.hook != "" && !hookNamePattern.MatchString(f.hook) {
		problems = append(problems, fmt.Sprintf("%s %q: a lifecycle hook name is 1-255 letters, digits, '-', '_' or '/'; give the name of the group's autoscaling:EC2_INSTANCE_TERMINATING hook", flagSource(f.fs, "aws-lifecycle-hook"), f.hook))
	}
	if f.tag != "" {
		k, v, err := aws.ParseTag(f.tag)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: %v; e.g. --aws-tag app:isLeader", flagSource(f.fs, "aws-tag"), f.tag, err))
		}
		f.tagKey, f.tagValue = k, v
	}
	return problems
}

// leavingError is the cause of the command's context when the instance is
// leaving its group: the command then does what SIGTERM does.
type leavingError struct{ reason string }

func (e *leavingError) Error() string { return e.reason }

// awsSession watches this instance for one command: it stops the command
// as SIGTERM would when the instance is leaving, keeps it from campaigning
// while the instance is not InService, and completes the lifecycle action
// once the command has handed over.
type awsSession struct {
	inst *aws.Instance
	gate *aws.Gate // with the leader tag of --aws-tag
	log  *slog.Logger

	// Metrics, for a command that serves them (register).
	leaves    *prometheus.CounterVec
	inService prometheus.GaugeFunc

	cancel  context.CancelCauseFunc // ends the command's context
	stopRun context.CancelFunc      // ends inst.Run
	wg      sync.WaitGroup

	mu      sync.Mutex
	leaving bool
	stopHB  func()
}

// startAWS starts watching this instance when the flags ask for it, and
// returns the context the command runs under: it ends, with a
// *leavingError cause, when the instance is leaving. finish must be called
// once the command has stopped its work, resigned and closed its backend.
// With the watch off it returns ctx and a nil session, whose methods do
// nothing.
func (f *awsFlags) startAWS(ctx context.Context, join string, log *slog.Logger) (context.Context, *awsSession, error) {
	if !f.active(join) {
		return ctx, nil, nil
	}
	// Implied by --join aws-asg alone, the watch is best effort: a member
	// outside the group (a witness joining with aws-asg:GROUP) runs
	// without it.
	explicit := f.enabled || f.hook != "" || f.rebalance || f.tag != ""
	asgAPI, ec2API, err := awsAPIClients(ctx)
	if err == nil {
		var inst *aws.Instance
		inst, err = aws.NewInstance(ctx, aws.InstanceOptions{ASG: asgAPI, Hook: f.hook, Rebalance: f.rebalance, Logger: log})
		if err == nil {
			return f.watch(ctx, inst, asgAPI, ec2API, log)
		}
	}
	var oe *aws.OptionsError
	config := errors.As(err, &oe) || errors.Is(err, aws.ErrNoRegion) || errors.Is(err, aws.ErrIdentity) ||
		errors.Is(err, aws.ErrNotInGroup) || errors.Is(err, aws.ErrLifecycleHook)
	switch {
	case !explicit && config:
		log.Warn("--join aws-asg: not watching this instance for its group's notices (pass --aws to require it)", "err", err)
		return ctx, nil, nil
	case config:
		return nil, nil, &exitError{code: exitUsage, err: fmt.Errorf("--aws: %w (the --aws-* flags need an instance of an Auto Scaling group)", err)}
	}
	return nil, nil, fmt.Errorf("--aws: watching this instance: %w", err)
}

// watch starts the session on inst.
func (f *awsFlags) watch(ctx context.Context, inst *aws.Instance, asgAPI *autoscaling.Client, ec2API *ec2.Client, log *slog.Logger) (context.Context, *awsSession, error) {
	var err error
	s := &awsSession{inst: inst, log: log.WithGroup("aws").With("instance", inst.ID(), "group", inst.Group())}
	var tagger *aws.Tagger
	if f.tag != "" {
		tagger, err = aws.NewTagger(aws.TagOptions{Key: f.tagKey, Value: f.tagValue, Group: inst.Group(), InstanceID: inst.ID(),
			EC2: ec2API, ASG: asgAPI, Logger: log})
		if err != nil {
			return nil, nil, &exitError{code: exitUsage, err: fmt.Errorf("--aws-tag: %w", err)}
		}
	}
	s.gate = aws.NewGate(inst, aws.GateOptions{Tagger: tagger, Logger: s.log})
	s.leaves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "baton_aws_leaving_total",
		Help: "Notices that this instance is leaving its Auto Scaling group, on which baton handed over as on SIGTERM, by reason (instance terminating, spot interruption, rebalance recommendation).",
	}, []string{"reason"})
	s.inService = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_aws_in_service",
		Help: "1 while this instance is InService in its Auto Scaling group (baton campaigns only then), else 0.",
	}, func() float64 {
		if inst.InService() {
			return 1
		}
		return 0
	})
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	s.stopRun = stopRun
	s.wg.Go(func() { _ = inst.Run(runCtx) })
	cctx, cancel := context.WithCancelCause(ctx)
	s.cancel = cancel
	s.wg.Go(func() {
		select {
		case <-inst.Leaving():
		case <-cctx.Done():
			return
		}
		reason := inst.LeaveReason()
		s.leaves.WithLabelValues(reason).Inc()
		s.log.Warn("instance leaving its group: handing over as on SIGTERM", "reason", reason, "lifecycle_hook", f.hook)
		s.mu.Lock()
		s.leaving = true
		// Heartbeats keep the hook from timing out while the command
		// stops its work and resigns; they end in finish.
		s.stopHB = inst.Heartbeat(runCtx)
		s.mu.Unlock()
		cancel(&leavingError{reason: reason})
	})
	s.log.Info("watching the instance", "in_service", inst.InService(), "lifecycle_hook", f.hook, "rebalance", f.rebalance)
	return cctx, s, nil
}

// register adds the session's metrics to reg: baton_aws_leaving_total
// {reason} and baton_aws_in_service.
func (s *awsSession) register(reg prometheus.Registerer) error {
	if s == nil {
		return nil
	}
	if err := reg.Register(s.leaves); err != nil {
		return err
	}
	return reg.Register(s.inService)
}

// completeTimeout bounds completing the lifecycle action at exit.
const completeTimeout = 30 * time.Second

// finish ends the watch. If the instance is leaving, the hand-over is
// over by now (the work stopped, the leases were resigned, the backend
// closed): it stops the heartbeats and completes the lifecycle action so
// that the group terminates the instance without waiting out the hook.
func (s *awsSession) finish(ctx context.Context) {
	if s == nil {
		return
	}
	s.cancel(nil)
	// Every term has ended by now; their tags are being removed.
	s.gate.Wait()
	s.mu.Lock()
	leaving, stopHB := s.leaving, s.stopHB
	s.mu.Unlock()
	if leaving {
		if stopHB != nil {
			stopHB()
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeTimeout)
		if err := s.inst.Complete(cctx); err != nil {
			s.log.Warn("completing the lifecycle action failed; the group terminates the instance when the hook times out", "err", err)
		} else {
			s.log.Info("handed over; lifecycle action completed", "reason", s.inst.LeaveReason())
		}
		cancel()
	}
	s.stopRun()
	s.wg.Wait()
}

// backend returns b gated by the instance's lifecycle state: a campaign
// waits while the instance is not InService, and a term is asked to
// resign (the work stops, then the lease is released) when it leaves
// InService. Without a session, b itself.
func (s *awsSession) backend(b baton.Backend) baton.Backend {
	if s == nil {
		return b
	}
	return s.gate.Backend(b)
}
