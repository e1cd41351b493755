package aws

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/smithy-go"

	"github.com/batonhq/baton/internal/awsfake"
)

// ruleOptions returns options whose built clients talk to f about group
// "web" in us-east-1.
func ruleOptions(t *testing.T, f *awsfake.Server) RuleOptions {
	return RuleOptions{
		Group:               "web",
		Region:              "us-east-1",
		Config:              &sdkaws.Config{Credentials: testCredentials},
		AutoScalingEndpoint: f.URL(),
		EC2Endpoint:         f.URL(),
		RetryMaxBackoff:     time.Millisecond,
		Logger:              slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

func TestRuleLowestInServiceHealthy(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddGroup("api")
	// Each of these sorts before the winner and must never win.
	f.Launch("i-01", "web", "Pending", "Healthy", "10.0.0.1")
	f.Launch("i-02", "web", "Standby", "Healthy", "10.0.0.2")
	f.Launch("i-03", "web", "Terminating", "Healthy", "10.0.0.3")
	f.Launch("i-04", "web", "Terminating:Wait", "Healthy", "10.0.0.4")
	f.Launch("i-05", "web", "InService", "Unhealthy", "10.0.0.5")
	f.Launch("i-06", "web", "Pending:Wait", "Healthy", "10.0.0.6")
	f.Launch("i-00", "api", "InService", "Healthy", "10.0.1.1") // another group
	f.Launch("i-09", "web", "InService", "Healthy", "10.0.0.9")
	f.Launch("i-07", "web", "InService", "Healthy", "10.0.0.7") // launched later, sorts first

	got, ok, err := LeaderByRule(context.Background(), ruleOptions(t, f))
	if err != nil || !ok {
		t.Fatalf("LeaderByRule = %+v, %v, %v", got, ok, err)
	}
	if got.InstanceID != "i-07" || got.PrivateIP != "10.0.0.7" || got.Group != "web" {
		t.Errorf("leader %+v, want i-07 at 10.0.0.7 in web", got)
	}
	if want := "lowest InService+Healthy instance id of 2 (group web has 8 instances)"; got.Decided != want {
		t.Errorf("Decided %q, want %q", got.Decided, want)
	}
	// Only the group and the winner are read: never the account's tags,
	// never every instance.
	if n := f.CallCount("DescribeAutoScalingGroups"); n != 1 {
		t.Errorf("DescribeAutoScalingGroups called %d times, want 1", n)
	}
	if b := f.DescribeInstancesBatches(); len(b) != 1 || b[0] != 1 {
		t.Errorf("DescribeInstances batches %v, want one request for the winner alone", b)
	}
	if n := f.TotalCalls(); n != 2 {
		t.Errorf("%d AWS calls, want 2", n)
	}

	// The winner leaves InService: the next in line wins.
	f.Set("i-07", func(in *awsfake.Instance) { in.Lifecycle = "Terminating:Wait" })
	if got, _, _ := LeaderByRule(context.Background(), ruleOptions(t, f)); got.InstanceID != "i-09" {
		t.Errorf("after i-07 left InService the leader is %q, want i-09", got.InstanceID)
	}
	f.Set("i-09", func(in *awsfake.Instance) { in.Health = "Unhealthy" })
	got, ok, err = LeaderByRule(context.Background(), ruleOptions(t, f))
	if err != nil || ok || got.InstanceID != "" {
		t.Errorf("with no InService+Healthy instance: %+v, %v, %v; want nobody, no error", got, ok, err)
	}
	if !strings.Contains(got.Decided, "no InService+Healthy instance in group web") {
		t.Errorf("Decided %q does not say why nobody leads", got.Decided)
	}
}

func TestRulePassesOverInstanceEC2ReportsGone(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-01", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch("i-02", "web", "InService", "Healthy", "10.0.0.2")
	// Terminated through EC2: Auto Scaling has not noticed yet.
	f.Set("i-01", func(in *awsfake.Instance) { in.State = "shutting-down" })

	got, ok, err := LeaderByRule(context.Background(), ruleOptions(t, f))
	if err != nil || !ok || got.InstanceID != "i-02" {
		t.Fatalf("LeaderByRule = %+v, %v, %v; want i-02", got, ok, err)
	}
	if !strings.Contains(got.Decided, "passed over i-01") {
		t.Errorf("Decided %q does not name the instance passed over", got.Decided)
	}
}

func TestRuleErrorsAreNotAnAnswer(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-01", "web", "InService", "Healthy", "10.0.0.1")

	opts := ruleOptions(t, f)
	opts.RetryMaxAttempts = 2
	f.ThrottleNext("DescribeAutoScalingGroups", 2)
	_, ok, err := LeaderByRule(context.Background(), opts)
	var ae smithy.APIError
	if ok || !errors.As(err, &ae) || ae.ErrorCode() != "Throttling" {
		t.Errorf("throttled: ok %v, err %v; want the Throttling error", ok, err)
	}

	f.ThrottleNext("DescribeInstances", 2)
	_, ok, err = LeaderByRule(context.Background(), opts)
	if ok || !errors.As(err, &ae) || ae.ErrorCode() != "RequestLimitExceeded" {
		t.Errorf("EC2 throttled: ok %v, err %v; want RequestLimitExceeded", ok, err)
	}

	// A throttled client retries; the caller's deadline ends it.
	f.ThrottleNext("DescribeAutoScalingGroups", 1000)
	opts.RetryMaxAttempts, opts.RetryMaxBackoff = 100, time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, ok, err = LeaderByRule(ctx, opts)
	if ok || err == nil {
		t.Errorf("throttled until the deadline: ok %v, err %v; want an error", ok, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("LeaderByRule returned %s after its context's deadline of 500ms", d)
	}

	f.ThrottleNext("DescribeAutoScalingGroups", 0)
	opts = ruleOptions(t, f)
	opts.Group = "nope"
	if _, _, err := LeaderByRule(context.Background(), opts); !errors.Is(err, ErrGroupNotFound) {
		t.Errorf("unknown group: %v, want ErrGroupNotFound", err)
	}
}

func TestRuleNoRegionNoCredentials(t *testing.T) {
	f := awsfake.Start(t)
	opts := ruleOptions(t, f)
	opts.Region = ""
	opts.Config = &sdkaws.Config{}           // no region, no credentials
	opts.IMDSEndpoint = "http://127.0.0.1:1" // nothing listens
	_, _, err := LeaderByRule(context.Background(), opts)
	if !errors.Is(err, ErrNoRegion) || !errors.Is(err, ErrNoCredentials) {
		t.Errorf("err %v, want both ErrNoRegion and ErrNoCredentials", err)
	}
	if n := f.TotalCalls(); n != 0 {
		t.Errorf("%d AWS calls without a region or credentials", n)
	}
}

func TestRuleOwnGroupFromIMDS(t *testing.T) {
	mock, _ := startMetadataMock(t)
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0000000000000000a", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch(metadataMockInstance, "web", "InService", "Healthy", "10.0.0.10")

	opts := ruleOptions(t, f)
	opts.Group, opts.Region = "", ""
	opts.IMDSEndpoint = mock
	got, ok, err := LeaderByRule(context.Background(), opts)
	if err != nil || !ok {
		t.Fatalf("LeaderByRule = %+v, %v, %v", got, ok, err)
	}
	if got.Self != metadataMockInstance || got.Group != "web" || got.InstanceID != "i-0000000000000000a" {
		t.Errorf("got %+v, want self %s in web, leader i-0000000000000000a", got, metadataMockInstance)
	}
}
