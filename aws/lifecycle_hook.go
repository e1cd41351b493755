package aws

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/smithy-go"
)

var (
	// ErrLifecycleHook reports that InstanceOptions.Hook cannot be used:
	// the group has no lifecycle hook of that name, or it is not a
	// termination hook (autoscaling:EC2_INSTANCE_TERMINATING).
	ErrLifecycleHook = errors.New("aws lifecycle: unusable lifecycle hook")

	// ErrNoLifecycleAction reports that Auto Scaling has no pending
	// lifecycle action for this instance and hook (its ValidationError):
	// the action was already completed, by this process or another, or it
	// timed out and the hook's default result applied.
	ErrNoLifecycleAction = errors.New("aws lifecycle: no pending lifecycle action for this instance")
)

// The transition of a termination lifecycle hook.
const terminatingTransition = "autoscaling:EC2_INSTANCE_TERMINATING"

// defaultHookHeartbeatTimeout is Auto Scaling's heartbeat timeout for a
// hook created without one.
const defaultHookHeartbeatTimeout = time.Hour

// maxRetryWait caps the wait between two attempts of a lifecycle action.
const maxRetryWait = 20 * time.Second

// readHook checks that the group has the termination hook opts.Hook and
// sets the heartbeat interval from its heartbeat timeout.
func (i *Instance) readHook(ctx context.Context) error {
	hook := i.opts.Hook
	out, err := i.asg.DescribeLifecycleHooks(ctx, &autoscaling.DescribeLifecycleHooksInput{
		AutoScalingGroupName: sdkaws.String(i.group),
		LifecycleHookNames:   []string{hook},
	})
	if err != nil {
		if isAccessDenied(err) {
			i.heartbeat = i.opts.HeartbeatInterval
			if i.heartbeat == 0 {
				i.heartbeat = DefaultHeartbeatInterval
			}
			i.log.Warn("cannot check the lifecycle hook (autoscaling:DescribeLifecycleHooks is denied); a wrong name will show only when the instance terminates",
				"hook", hook, "group", i.group, "heartbeat_interval", i.heartbeat, "err", err)
			return nil
		}
		return fmt.Errorf("aws lifecycle: DescribeLifecycleHooks %q of group %q: %w", hook, i.group, err)
	}
	for _, h := range out.LifecycleHooks {
		if sdkaws.ToString(h.LifecycleHookName) != hook {
			continue
		}
		if tr := sdkaws.ToString(h.LifecycleTransition); tr != terminatingTransition {
			return fmt.Errorf("%w: hook %q of group %q is for %s; want a termination hook (%s)", ErrLifecycleHook, hook, i.group, tr, terminatingTransition)
		}
		timeout := defaultHookHeartbeatTimeout
		if h.HeartbeatTimeout != nil {
			timeout = time.Duration(*h.HeartbeatTimeout) * time.Second
		}
		i.heartbeat = i.opts.HeartbeatInterval
		if i.heartbeat == 0 {
			// Two heartbeats may fail before the hook times out.
			i.heartbeat = max(timeout/3, time.Second)
		}
		if i.heartbeat >= timeout {
			i.log.Warn("HeartbeatInterval is not shorter than the hook's heartbeat timeout: the hook may time out during a hand-over",
				"heartbeat_interval", i.heartbeat, "heartbeat_timeout", timeout)
		}
		i.log.Debug("lifecycle hook", "hook", hook, "heartbeat_timeout", timeout, "heartbeat_interval", i.heartbeat,
			"default_result", sdkaws.ToString(h.DefaultResult))
		return nil
	}
	return fmt.Errorf("%w: group %q has no lifecycle hook %q; create it (aws autoscaling put-lifecycle-hook --lifecycle-transition %s) or fix the name",
		ErrLifecycleHook, i.group, hook, terminatingTransition)
}

// Heartbeat sends RecordLifecycleActionHeartbeat for this instance and the
// hook at once and then every heartbeat interval (see
// InstanceOptions.HeartbeatInterval), so that Auto Scaling does not give up
// on a hand-over that outlasts the hook's heartbeat timeout. It sends
// nothing until the target lifecycle state is Terminated (only then does a
// lifecycle action exist), and stops after Complete succeeds. Failures are
// logged and retried; none stops it.
//
// Without a Hook, or while Leaving is open, it does nothing. Call stop
// when the hand-over is over: it returns once the heartbeats have stopped.
// They stop too when ctx ends. stop may be called more than once.
func (i *Instance) Heartbeat(ctx context.Context) (stop func()) {
	if i.opts.Hook == "" || !i.isLeaving() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		i.heartbeats(ctx)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

func (i *Instance) heartbeats(ctx context.Context) {
	wait := time.Duration(0)
	failures := 0
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if ctx.Err() != nil || i.isCompleted() {
			return
		}
		if !i.terminating(ctx) {
			wait = i.opts.Interval
			continue
		}
		_, err := i.asg.RecordLifecycleActionHeartbeat(ctx, &autoscaling.RecordLifecycleActionHeartbeatInput{
			AutoScalingGroupName: sdkaws.String(i.group),
			LifecycleHookName:    sdkaws.String(i.opts.Hook),
			InstanceId:           sdkaws.String(i.id),
		})
		switch {
		case err == nil:
			failures = 0
			wait = i.heartbeat
			i.log.Debug("lifecycle action heartbeat sent", "hook", i.opts.Hook, "next_in", wait)
		case ctx.Err() != nil:
			return
		case retryable(err):
			failures++
			wait = min(i.retryWait(failures), i.heartbeat)
			i.log.Warn("lifecycle action heartbeat failed; retrying", "hook", i.opts.Hook, "retry_in", wait, "err", err)
		default:
			failures = 0
			wait = i.heartbeat
			i.log.Warn("lifecycle action heartbeat refused", "hook", i.opts.Hook, "err", i.actionError("RecordLifecycleActionHeartbeat", err))
		}
	}
}

// Complete tells Auto Scaling that this instance's hand-over is done:
// CompleteLifecycleAction with the result CONTINUE for this instance and
// the hook, so that the termination goes on without waiting out the
// hook's timeout. Throttling and other transient failures are retried
// until ctx ends.
//
// Without a Hook, while Leaving is open, or once it has succeeded, it
// does nothing and returns nil. After a spot interruption or a rebalance
// recommendation it first waits, polling IMDS every Interval, for the
// target lifecycle state Terminated, since Auto Scaling creates the
// lifecycle action only when it starts terminating the instance; bound
// that wait with ctx (a rebalance recommendation may never lead to it).
//
// Errors: ErrNoLifecycleAction when Auto Scaling has no pending action for
// the instance; ctx's error when it ends first; or the AWS error, wrapped
// with the IAM action it needs when access was denied.
func (i *Instance) Complete(ctx context.Context) error {
	if i.opts.Hook == "" || !i.isLeaving() {
		return nil
	}
	// One call at a time: a second caller finds the action completed
	// instead of drawing Auto Scaling's ValidationError.
	i.completeMu.Lock()
	defer i.completeMu.Unlock()
	if i.isCompleted() {
		return nil
	}
	for !i.terminating(ctx) {
		t := time.NewTimer(i.opts.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("aws lifecycle: waiting for Auto Scaling to start terminating the instance (%s), to complete its lifecycle action: %w", i.LeaveReason(), ctx.Err())
		case <-t.C:
		}
	}
	for failures := 1; ; failures++ {
		_, err := i.asg.CompleteLifecycleAction(ctx, &autoscaling.CompleteLifecycleActionInput{
			AutoScalingGroupName:  sdkaws.String(i.group),
			LifecycleHookName:     sdkaws.String(i.opts.Hook),
			LifecycleActionResult: sdkaws.String("CONTINUE"),
			InstanceId:            sdkaws.String(i.id),
		})
		if err == nil {
			i.mu.Lock()
			i.completed = true
			i.mu.Unlock()
			i.log.Info("lifecycle action completed: the termination goes on", "hook", i.opts.Hook, "result", "CONTINUE", "reason", i.LeaveReason())
			return nil
		}
		if ctx.Err() != nil || !retryable(err) {
			return i.actionError("CompleteLifecycleAction", err)
		}
		wait := i.retryWait(failures)
		i.log.Warn("CompleteLifecycleAction failed; retrying", "hook", i.opts.Hook, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("aws lifecycle: CompleteLifecycleAction for instance %s, hook %q: %w (last error: %w)", i.id, i.opts.Hook, ctx.Err(), err)
		case <-t.C:
		}
	}
}

func (i *Instance) isCompleted() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.completed
}

// terminating reports whether a lifecycle action may be pending: the
// target lifecycle state is Terminated, reading IMDS again if it was not.
// Where IMDS has no target lifecycle state it assumes so, and lets Auto
// Scaling answer.
func (i *Instance) terminating(ctx context.Context) bool {
	i.mu.Lock()
	target := i.target
	i.mu.Unlock()
	if target == targetTerminated {
		return true
	}
	target, found, err := i.readIMDS(ctx, pathTargetState)
	if err != nil {
		return false
	}
	if !found {
		return true
	}
	if target == targetTerminated {
		i.pollIMDS(ctx) // record it, as Run would
	}
	return target == targetTerminated
}

// retryWait is the wait before attempt failures+1 of a lifecycle action:
// exponential from retryBase, capped, with full jitter above half.
func (i *Instance) retryWait(failures int) time.Duration {
	d := i.retryBase
	for range failures - 1 {
		d *= 2
		if d >= maxRetryWait {
			d = maxRetryWait
			break
		}
	}
	return d/2 + time.Duration(float64(d/2)*i.rand())
}

// actionError wraps the error of a lifecycle action call.
func (i *Instance) actionError(action string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch {
		case ae.ErrorCode() == "ValidationError":
			return fmt.Errorf("%w: %s for instance %s, hook %q of group %q: %w", ErrNoLifecycleAction, action, i.id, i.opts.Hook, i.group, err)
		case isAccessDenied(err):
			return fmt.Errorf("aws lifecycle: %s for instance %s, hook %q of group %q is denied: allow autoscaling:%s on the group: %w", action, i.id, i.opts.Hook, i.group, action, err)
		}
	}
	return fmt.Errorf("aws lifecycle: %s for instance %s, hook %q of group %q: %w", action, i.id, i.opts.Hook, i.group, err)
}

// retryable reports whether a call may succeed if tried again: throttling,
// a 5xx, a broken connection, or Auto Scaling's ResourceContention.
func retryable(err error) bool {
	if retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == sdkaws.TrueTernary {
		return true
	}
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "ResourceContention"
}

func isAccessDenied(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "AccessDenied", "AccessDeniedException", "UnauthorizedOperation":
		return true
	}
	return false
}

// adaptiveRetryer returns a new adaptive-mode retryer: its client-side rate
// limit adapts to throttling, so each client gets its own.
func adaptiveRetryer(attempts int, maxBackoff time.Duration) sdkaws.Retryer {
	return retry.NewAdaptiveMode(func(ao *retry.AdaptiveModeOptions) {
		ao.StandardOptions = append(ao.StandardOptions, func(so *retry.StandardOptions) {
			so.MaxAttempts = attempts
			so.MaxBackoff = maxBackoff
		})
	})
}
