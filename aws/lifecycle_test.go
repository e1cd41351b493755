package aws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// startInstanceMock runs one amazon-ec2-metadata-mock for the simulated
// instance id, with IMDSv2 required, in the mode and with the flags of
// args (such as "asglifecycle", "--asg-termination-delay-sec", "3"), and
// returns its endpoint. The mock's delays count from its start.
func startInstanceMock(t *testing.T, id string, args ...string) string {
	t.Helper()
	return testserver.StartMetadataMock(t, 0, fmt.Sprintf(instanceMockConfig, id), args...).URL
}

// instanceMockConfig replaces the mock's instance ID, in the metadata and
// in the identity document (whose fields must all be given).
const instanceMockConfig = `{
  "metadata": {"values": {"instance-id": %[1]q}},
  "dynamic": {"values": {"instance-identity-document": {
    "accountId": "123456789012", "imageId": "ami-12345678", "availabilityZone": "us-east-1a",
    "version": "2017-09-30", "privateIp": "10.0.0.1", "instanceId": %[1]q,
    "pendingTime": "2026-01-01T00:00:00Z", "architecture": "x86_64",
    "instanceType": "t3.micro", "region": "us-east-1"}}}
}`

// instanceOptions returns options whose built clients talk to the mock and
// to f, polling fast.
func instanceOptions(t *testing.T, f *awsfake.Server, mock string) InstanceOptions {
	return InstanceOptions{
		IMDSEndpoint:        mock,
		AutoScalingEndpoint: f.URL(),
		Config:              &sdkaws.Config{Credentials: testCredentials},
		Interval:            20 * time.Millisecond,
		StateInterval:       120 * time.Millisecond,
		Logger:              slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// singleAttemptClient is an Auto Scaling client for f that tries each call
// once, so that a test sees the Instance's own retries.
func singleAttemptClient(f *awsfake.Server) *autoscaling.Client {
	return autoscaling.New(autoscaling.Options{
		Region:           "us-east-1",
		Credentials:      testCredentials,
		BaseEndpoint:     sdkaws.String(f.URL()),
		RetryMaxAttempts: 1,
	})
}

func newTestInstance(t *testing.T, opts InstanceOptions) *Instance {
	t.Helper()
	i, err := NewInstance(testkit.Context(t, 30*time.Second), opts)
	if err != nil {
		t.Fatalf("NewInstance: %v", err)
	}
	return i
}

// runInstance runs i until the test ends, and waits for Run to return.
func runInstance(t *testing.T, i *Instance) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- i.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func waitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %s", what, d)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// stillServing checks that i has polled IMDS n more times without leaving
// and is in service.
func stillServing(t *testing.T, i *Instance, n int) {
	t.Helper()
	from := i.pollCount()
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d more IMDS polls of %s", n, i.ID()), func() bool {
		return i.pollCount() >= from+n
	})
	if isClosed(i.Leaving()) || i.LeaveReason() != "" {
		t.Errorf("%s is leaving (%q), want it to stay", i.ID(), i.LeaveReason())
	}
	if !i.InService() {
		t.Errorf("%s: InService false, want true", i.ID())
	}
}

func TestInstanceLeavesWhenTerminated(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0aaa", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch("i-0bbb", "web", "InService", "Healthy", "10.0.0.2")
	// One mock per instance: a's target lifecycle state turns Terminated
	// three seconds after its start, b's stays InService.
	mockA := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "3")
	mockB := startInstanceMock(t, "i-0bbb", "asglifecycle", "--asg-termination-delay-sec", "3600")

	a := newTestInstance(t, instanceOptions(t, f, mockA))
	b := newTestInstance(t, instanceOptions(t, f, mockB))
	if a.ID() != "i-0aaa" || a.Group() != "web" || b.ID() != "i-0bbb" || b.Group() != "web" {
		t.Fatalf("identities %s in %s, %s in %s; want i-0aaa and i-0bbb in web", a.ID(), a.Group(), b.ID(), b.Group())
	}
	changed := a.InServiceChanged()
	wasInService := a.InService()
	if !wasInService {
		t.Logf("a was constructed after its termination showed (a slow machine): the change of InService is not checked")
	}
	runInstance(t, a)
	runInstance(t, b)

	waitClosed(t, a.Leaving(), 30*time.Second, "a's Leaving")
	if got := a.LeaveReason(); got != "instance terminating" {
		t.Errorf("LeaveReason = %q, want %q", got, ReasonTerminating)
	}
	if a.InService() {
		t.Error("a is InService while terminating")
	}
	if wasInService && !isClosed(changed) {
		t.Error("InServiceChanged did not close when a left service")
	}
	stillServing(t, b, 5)
}

func TestInstanceLeavesOnSpotInterruption(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0spot", "web", "InService", "Healthy", "10.0.0.1")
	// The rebalance recommendation is there from the start, the
	// interruption notice after two seconds: without Rebalance only the
	// latter counts.
	mock := startInstanceMock(t, "i-0spot", "spot", "--mock-delay-sec", "2", "--rebalance-delay-sec", "0")
	i := newTestInstance(t, instanceOptions(t, f, mock))
	runInstance(t, i)
	waitClosed(t, i.Leaving(), 30*time.Second, "Leaving")
	if got := i.LeaveReason(); got != "spot interruption" {
		t.Errorf("LeaveReason = %q, want %q", got, ReasonSpot)
	}
	if i.InService() {
		t.Error("InService after a spot interruption notice")
	}
}

func TestInstanceRebalanceOnlyWhenAsked(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0spot", "web", "InService", "Healthy", "10.0.0.1")
	mock := startInstanceMock(t, "i-0spot", "spot", "--mock-delay-sec", "3600", "--rebalance-delay-sec", "0")

	opts := instanceOptions(t, f, mock)
	opts.Rebalance = true
	with := newTestInstance(t, opts)
	runInstance(t, with)
	waitClosed(t, with.Leaving(), 30*time.Second, "Leaving with Rebalance")
	if got := with.LeaveReason(); got != "rebalance recommendation" {
		t.Errorf("LeaveReason = %q, want %q", got, ReasonRebalance)
	}

	// The recommendation is there (with saw it); without Rebalance it is
	// not a reason to leave.
	without := newTestInstance(t, instanceOptions(t, f, mock))
	runInstance(t, without)
	stillServing(t, without, 10)
}

func TestInstanceOwnStateGatesInService(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0aaa", "web", "Pending", "Healthy", "10.0.0.1")
	mock := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "3600")
	i := newTestInstance(t, instanceOptions(t, f, mock))
	if i.InService() {
		t.Fatal("InService while Pending")
	}
	runInstance(t, i)

	for _, step := range []struct {
		state string
		want  bool
	}{
		{"InService", true},
		{"Standby", false},
		{"InService", true},
		{"Pending:Wait", false},
		{"InService", true},
		{"Terminating", false},
		{"InService", true},
		{"Detached", false},
	} {
		changed := i.InServiceChanged()
		f.Set("i-0aaa", func(in *awsfake.Instance) { in.Lifecycle = step.state })
		waitClosed(t, changed, 30*time.Second, "InServiceChanged after "+step.state)
		if got := i.InService(); got != step.want {
			t.Fatalf("state %s: InService = %v, want %v", step.state, got, step.want)
		}
	}

	// An instance that left the group is not in service either.
	changed := i.InServiceChanged()
	f.Set("i-0aaa", func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	waitClosed(t, changed, 30*time.Second, "InServiceChanged after InService")
	changed = i.InServiceChanged()
	f.Terminate("i-0aaa")
	waitClosed(t, changed, 30*time.Second, "InServiceChanged after the instance left the group")
	if i.InService() {
		t.Error("InService after the instance left the group")
	}
	if isClosed(i.Leaving()) {
		t.Errorf("Leaving closed (%q) on a change of the own state alone", i.LeaveReason())
	}
}

// timedASG records when each DescribeAutoScalingInstances call was made.
type timedASG struct {
	LifecycleAPI
	mu    sync.Mutex
	calls []time.Time
}

func (c *timedASG) DescribeAutoScalingInstances(ctx context.Context, in *autoscaling.DescribeAutoScalingInstancesInput, optFns ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingInstancesOutput, error) {
	c.mu.Lock()
	c.calls = append(c.calls, time.Now())
	c.mu.Unlock()
	return c.LifecycleAPI.DescribeAutoScalingInstances(ctx, in, optFns...)
}

func (c *timedASG) times() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.calls...)
}

func TestInstanceStateBacksOffOnThrottling(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0aaa", "web", "Pending", "Healthy", "10.0.0.1")
	mock := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "3600")
	client := &timedASG{LifecycleAPI: singleAttemptClient(f)}
	opts := instanceOptions(t, f, mock)
	opts.ASG, opts.AutoScalingEndpoint = client, ""
	i := newTestInstance(t, opts)

	const throttled = 4
	f.ThrottleNext("DescribeAutoScalingInstances", throttled)
	f.Set("i-0aaa", func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	changed := i.InServiceChanged()
	runInstance(t, i)
	waitClosed(t, changed, 30*time.Second, "InService after the throttling")
	if !i.InService() {
		t.Fatal("InService false after Auto Scaling answered InService")
	}

	// Calls: NewInstance's, then the throttled ones, then the one that
	// answered. The wait after k failures in a row is at least the
	// entering pace (StateInterval/6) doubled k times, less the jitter.
	calls := client.times()
	if len(calls) < throttled+2 {
		t.Fatalf("%d DescribeAutoScalingInstances calls, want at least %d", len(calls), throttled+2)
	}
	base := opts.StateInterval / enteringDivisor
	for k := 1; k <= throttled; k++ {
		gap := calls[k+1].Sub(calls[k])
		floor := time.Duration(float64(base<<k) * (1 - cacheJitter))
		if gap < floor {
			t.Errorf("wait after %d throttled calls = %s, want at least %s", k, gap, floor)
		}
	}
}

func TestInstanceFailsClosedWithoutToken(t *testing.T) {
	for _, status := range []int{http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			v1 := &imdsV1Only{tokenStatus: status}
			srv := httptest.NewServer(v1)
			t.Cleanup(srv.Close)
			f := awsfake.Start(t)
			f.AddGroup("web")
			f.Launch("i-0v1only", "web", "InService", "Healthy", "10.0.0.1")

			_, err := NewInstance(testkit.Context(t, 30*time.Second), instanceOptions(t, f, srv.URL))
			if !errors.Is(err, ErrIdentity) {
				t.Fatalf("NewInstance error = %v, want ErrIdentity", err)
			}
			v1.mu.Lock()
			defer v1.mu.Unlock()
			if v1.tokenReq == 0 {
				t.Error("no token was requested")
			}
			if len(v1.gets) != 0 {
				t.Errorf("the metadata service saw requests without a token: %q", v1.gets)
			}
			if n := f.TotalCalls(); n != 0 {
				t.Errorf("%d AWS API calls without an identity, want 0", n)
			}
		})
	}
}

func TestNewInstanceErrors(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0aaa", "web", "InService", "Healthy", "10.0.0.1")
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "launch", Transition: awsfake.TransitionLaunching})
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "drain"}) // Auto Scaling's default timeout, 1h
	mock := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "3600")

	for _, tc := range []struct {
		hook string
		want []string
	}{
		{"missing", []string{`group "web" has no lifecycle hook "missing"`, "put-lifecycle-hook"}},
		{"launch", []string{`hook "launch" of group "web"`, "autoscaling:EC2_INSTANCE_LAUNCHING", "autoscaling:EC2_INSTANCE_TERMINATING"}},
	} {
		opts := instanceOptions(t, f, mock)
		opts.Hook = tc.hook
		_, err := NewInstance(testkit.Context(t, 30*time.Second), opts)
		if !errors.Is(err, ErrLifecycleHook) {
			t.Errorf("hook %q: error = %v, want ErrLifecycleHook", tc.hook, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("hook %q: error %q does not say %q", tc.hook, err, w)
			}
		}
	}

	// The heartbeat interval is a third of the hook's heartbeat timeout.
	opts := instanceOptions(t, f, mock)
	opts.Hook = "drain"
	if i := newTestInstance(t, opts); i.heartbeat != 20*time.Minute {
		t.Errorf("heartbeat interval %s for a 1h heartbeat timeout, want 20m", i.heartbeat)
	}

	// An instance outside any group.
	f.Launch("i-0lone", "", "", "", "10.0.0.9")
	lone := startInstanceMock(t, "i-0lone", "asglifecycle", "--asg-termination-delay-sec", "3600")
	_, err := NewInstance(testkit.Context(t, 30*time.Second), instanceOptions(t, f, lone))
	if !errors.Is(err, ErrNotInGroup) || !strings.Contains(err.Error(), "i-0lone") {
		t.Errorf("NewInstance outside a group: %v, want ErrNotInGroup naming i-0lone", err)
	}
}

func TestInstanceOptionsValidation(t *testing.T) {
	f := awsfake.Start(t)
	_, err := NewInstance(context.Background(), InstanceOptions{
		Interval:            -time.Second,
		StateInterval:       -time.Second,
		HeartbeatInterval:   -time.Second,
		Hook:                "bad hook!",
		IMDSEndpoint:        "not a url",
		ASG:                 singleAttemptClient(f),
		AutoScalingEndpoint: f.URL(),
	})
	var oe *OptionsError
	if !errors.As(err, &oe) {
		t.Fatalf("error = %v, want *OptionsError", err)
	}
	for _, w := range []string{"Interval -1s", "StateInterval -1s", "HeartbeatInterval -1s", `Hook "bad hook!"`, `IMDSEndpoint "not a url"`, "AutoScalingEndpoint is set but so is ASG"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	if len(oe.Problems) != 6 {
		t.Errorf("%d problems, want 6: %q", len(oe.Problems), oe.Problems)
	}
	if n := f.TotalCalls(); n != 0 {
		t.Errorf("%d AWS calls with invalid options, want 0", n)
	}
}

// lifecycleCalls returns f's lifecycle calls of one action.
func lifecycleCalls(f *awsfake.Server, action string) []awsfake.LifecycleCall {
	var out []awsfake.LifecycleCall
	for _, c := range f.LifecycleCalls() {
		if c.Action == action {
			out = append(out, c)
		}
	}
	return out
}

func lifecycleState(f *awsfake.Server, id string) string {
	var s string
	f.Set(id, func(in *awsfake.Instance) { s = in.Lifecycle })
	return s
}

func TestInstanceCompletesAfterHandOver(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	// A heartbeat timeout that a hand-over without heartbeats would miss.
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "drain", HeartbeatTimeout: 3 * time.Second})
	f.Launch("i-0aaa", "web", "InService", "Healthy", "10.0.0.1")
	mock := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "3")
	opts := instanceOptions(t, f, mock)
	opts.Hook = "drain"
	i := newTestInstance(t, opts)
	if i.heartbeat != time.Second {
		t.Errorf("heartbeat interval %s for a 3s heartbeat timeout, want 1s", i.heartbeat)
	}
	runInstance(t, i)
	ctx := testkit.Context(t, time.Minute)

	// Before Leaving, Heartbeat and Complete do nothing.
	if !isClosed(i.Leaving()) {
		i.Heartbeat(ctx)()
		if err := i.Complete(ctx); err != nil {
			t.Errorf("Complete before Leaving: %v", err)
		}
		if c := f.LifecycleCalls(); len(c) != 0 {
			t.Errorf("lifecycle calls before Leaving: %+v", c)
		}
	}

	waitClosed(t, i.Leaving(), 30*time.Second, "Leaving")
	if got := i.LeaveReason(); got != ReasonTerminating {
		t.Fatalf("LeaveReason = %q, want %q", got, ReasonTerminating)
	}
	// Auto Scaling's side of the termination: the instance waits in
	// Terminating:Wait for the hook. (The mock's target state and the
	// fake's lifecycle action are not linked; on AWS both change at once.)
	f.BeginTermination("i-0aaa")
	began := time.Now()

	// A hand-over that outlasts the hook's heartbeat timeout.
	stop := i.Heartbeat(ctx)
	testkit.Eventually(t, 30*time.Second, "heartbeats beyond the hook's heartbeat timeout", func() bool {
		return len(lifecycleCalls(f, "RecordLifecycleActionHeartbeat")) >= 4 && time.Since(began) > 4*time.Second
	})
	stop()
	stop() // a second stop is harmless
	handedOver := time.Now()

	if err := i.Complete(ctx); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := i.Complete(ctx); err != nil { // done already: no second call
		t.Errorf("second Complete: %v", err)
	}
	if got := lifecycleCalls(f, "Timeout"); len(got) != 0 {
		t.Errorf("the hook timed out during the hand-over: %+v", got)
	}
	for _, c := range lifecycleCalls(f, "RecordLifecycleActionHeartbeat") {
		if c.Error != "" || c.InstanceID != "i-0aaa" || c.Hook != "drain" || c.Group != "web" || c.At.After(handedOver) {
			t.Errorf("heartbeat %+v: want a successful one for i-0aaa, drain, web, before the hand-over ended", c)
		}
	}
	completes := lifecycleCalls(f, "CompleteLifecycleAction")
	if len(completes) != 1 {
		t.Fatalf("CompleteLifecycleAction calls %+v, want one", completes)
	}
	c := completes[0]
	if c.Error != "" || c.Result != "CONTINUE" || c.InstanceID != "i-0aaa" || c.Hook != "drain" || c.Group != "web" {
		t.Errorf("CompleteLifecycleAction %+v, want CONTINUE for i-0aaa, drain, web", c)
	}
	if !c.At.After(handedOver) {
		t.Errorf("CompleteLifecycleAction at %s, before the hand-over ended at %s", c.At, handedOver)
	}
	if s := lifecycleState(f, "i-0aaa"); s != "Terminating:Proceed" {
		t.Errorf("lifecycle state %q after Complete, want Terminating:Proceed", s)
	}
}

func TestInstanceCompleteWithoutPendingAction(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "drain", HeartbeatTimeout: 200 * time.Millisecond, DefaultResult: "CONTINUE"})
	f.Launch("i-0aaa", "web", "InService", "Healthy", "10.0.0.1")
	mock := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "0")
	opts := instanceOptions(t, f, mock)
	opts.Hook = "drain"
	i := newTestInstance(t, opts)
	if !isClosed(i.Leaving()) {
		t.Fatal("Leaving open with the target lifecycle state Terminated from the start")
	}
	ctx := testkit.Context(t, time.Minute)

	// No lifecycle action was ever started for the instance.
	err := i.Complete(ctx)
	if !errors.Is(err, ErrNoLifecycleAction) || !strings.Contains(err.Error(), "i-0aaa") || !strings.Contains(err.Error(), `"drain"`) {
		t.Errorf("Complete without an action: %v, want ErrNoLifecycleAction naming the instance and the hook", err)
	}

	// One that timed out before the hand-over ended.
	f.Set("i-0aaa", func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	f.BeginTermination("i-0aaa")
	testkit.Eventually(t, 30*time.Second, "the hook's timeout", func() bool { return len(lifecycleCalls(f, "Timeout")) == 1 })
	if err := i.Complete(ctx); !errors.Is(err, ErrNoLifecycleAction) {
		t.Errorf("Complete after the hook timed out: %v, want ErrNoLifecycleAction", err)
	}
	if got := lifecycleCalls(f, "CompleteLifecycleAction"); len(got) != 2 || got[0].Error != "ValidationError" || got[1].Error != "ValidationError" {
		t.Errorf("CompleteLifecycleAction calls %+v, want two answered ValidationError", got)
	}
}

func TestInstanceCompleteRetriesThrottling(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "drain"})
	f.Launch("i-0aaa", "web", "InService", "Healthy", "10.0.0.1")
	mock := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "0")
	opts := instanceOptions(t, f, mock)
	opts.Hook = "drain"
	opts.ASG, opts.AutoScalingEndpoint = singleAttemptClient(f), ""
	i := newTestInstance(t, opts)
	i.retryBase = 10 * time.Millisecond
	f.BeginTermination("i-0aaa")

	f.ThrottleNext("CompleteLifecycleAction", 3)
	if err := i.Complete(testkit.Context(t, time.Minute)); err != nil {
		t.Fatalf("Complete through throttling: %v", err)
	}
	if n := f.CallCount("CompleteLifecycleAction"); n != 4 {
		t.Errorf("%d CompleteLifecycleAction requests, want 3 throttled and 1 answered", n)
	}
	if s := lifecycleState(f, "i-0aaa"); s != "Terminating:Proceed" {
		t.Errorf("lifecycle state %q after Complete, want Terminating:Proceed", s)
	}
}

func TestInstanceCompleteAfterSpotWaitsForTermination(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "drain"})
	f.Launch("i-0spot", "web", "InService", "Healthy", "10.0.0.1")
	// All of the mock's paths: the interruption notice from the start,
	// the target lifecycle state Terminated three seconds later.
	mock := startInstanceMock(t, "i-0spot", "--mock-delay-sec", "0", "--asg-termination-delay-sec", "3")
	opts := instanceOptions(t, f, mock)
	opts.Hook = "drain"
	i := newTestInstance(t, opts)
	waitClosed(t, i.Leaving(), 30*time.Second, "Leaving")
	if got := i.LeaveReason(); got != ReasonSpot {
		t.Fatalf("LeaveReason = %q, want %q", got, ReasonSpot)
	}

	// Auto Scaling has not started terminating the instance: there is no
	// lifecycle action to complete yet, and Complete waits for one.
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	switch err := i.Complete(short); {
	case errors.Is(err, context.DeadlineExceeded):
		if n := f.CallCount("CompleteLifecycleAction"); n != 0 {
			t.Errorf("%d CompleteLifecycleAction calls before the termination, want 0", n)
		}
	case errors.Is(err, ErrNoLifecycleAction):
		t.Logf("the target state turned Terminated within Complete's 100ms (a slow machine): %v", err)
	default:
		t.Errorf("Complete before the termination: %v, want it to wait until its context ends", err)
	}

	f.BeginTermination("i-0spot")
	if err := i.Complete(testkit.Context(t, time.Minute)); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if c := lifecycleCalls(f, "CompleteLifecycleAction"); len(c) != 1 || c[0].Error != "" || c[0].Result != "CONTINUE" {
		t.Errorf("CompleteLifecycleAction calls %+v, want one CONTINUE", c)
	}
}

// targetOverride is the real metadata client with the target lifecycle
// state replaced while override is set: the mock serves only InService and
// Terminated, and Auto Scaling also sets Standby, Detached and the warm
// pool's states.
type targetOverride struct {
	InstanceIMDSAPI
	mu       sync.Mutex
	override string
}

func (c *targetOverride) set(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.override = s
}

func (c *targetOverride) GetMetadata(ctx context.Context, in *imds.GetMetadataInput, optFns ...func(*imds.Options)) (*imds.GetMetadataOutput, error) {
	c.mu.Lock()
	s := c.override
	c.mu.Unlock()
	if in.Path == pathTargetState && s != "" {
		return &imds.GetMetadataOutput{Content: io.NopCloser(strings.NewReader(s))}, nil
	}
	return c.InstanceIMDSAPI.GetMetadata(ctx, in, optFns...)
}

func TestInstanceTargetStateLeavesServiceAtOnce(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0aaa", "web", "InService", "Healthy", "10.0.0.1")
	mock := startInstanceMock(t, "i-0aaa", "asglifecycle", "--asg-termination-delay-sec", "3600")
	client := &targetOverride{InstanceIMDSAPI: imds.New(imds.Options{Endpoint: mock, EnableFallback: sdkaws.FalseTernary})}
	opts := instanceOptions(t, f, "")
	opts.IMDS = client
	// Auto Scaling is asked only once an hour: the changes below come
	// from IMDS alone.
	opts.StateInterval = time.Hour
	i := newTestInstance(t, opts)
	if !i.InService() {
		t.Fatal("InService false with both states InService")
	}
	runInstance(t, i)

	for _, target := range []string{"Standby", "InService", "Detached", "InService", "Warmed:Stopped", "InService"} {
		changed := i.InServiceChanged()
		client.set(target)
		waitClosed(t, changed, 30*time.Second, "InServiceChanged on the target state "+target)
		if got, want := i.InService(), target == "InService"; got != want {
			t.Fatalf("target %s: InService = %v, want %v", target, got, want)
		}
	}
	if isClosed(i.Leaving()) {
		t.Errorf("Leaving closed (%q) on a target state other than Terminated", i.LeaveReason())
	}
	if n := f.CallCount("DescribeAutoScalingInstances"); n != 1 {
		t.Errorf("%d DescribeAutoScalingInstances calls, want NewInstance's only", n)
	}
}

// TestInstanceStateDelay checks the pace of DescribeAutoScalingInstances:
// one call a StateInterval while InService, six while entering service,
// doubling after failures up to five minutes, each within ±20%.
func TestInstanceStateDelay(t *testing.T) {
	i := &Instance{opts: InstanceOptions{StateInterval: DefaultStateInterval}, own: "InService", target: "InService"}
	for _, tc := range []struct {
		own, target, reason string
		failures            int
		want                time.Duration
	}{
		{"InService", "InService", "", 0, time.Minute},
		{"InService", "", "", 0, time.Minute},
		{"Pending", "InService", "", 0, 10 * time.Second},
		{"Pending", "", "", 0, 10 * time.Second},
		{"Standby", "InService", "", 0, 10 * time.Second}, // leaving standby
		{"Standby", "Standby", "", 0, time.Minute},
		{"InService", "InService", ReasonSpot, 0, time.Minute},
		{"InService", "InService", "", 1, 2 * time.Minute},
		{"InService", "InService", "", 2, 4 * time.Minute},
		{"InService", "InService", "", 3, 5 * time.Minute},
		{"InService", "InService", "", 40, 5 * time.Minute},
		{"Pending", "InService", "", 2, 40 * time.Second},
	} {
		i.own, i.target, i.reason = tc.own, tc.target, tc.reason
		for _, draw := range []struct {
			r      float64
			factor float64
		}{{0, 0.8}, {0.5, 1}, {0.999999, 1.2}} {
			i.rand = func() float64 { return draw.r }
			got := i.stateDelay(tc.failures)
			want := time.Duration(float64(tc.want) * draw.factor)
			if d := got - want; d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("own %s, target %q, leaving %q, %d failures, draw %v: %s, want %s", tc.own, tc.target, tc.reason, tc.failures, draw.r, got, want)
			}
		}
	}
}
