package aws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/batonhq/baton/internal/awsfake"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/batonhq/baton/discovery"
)

// fakeClock is the clock of an ASG's cache, moved only by the test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testCredentials are static: the SDK signs with them and never looks for
// others.
var testCredentials = credentials.NewStaticCredentialsProvider("AKIDBATONTEST", "secret", "")

// fakeAWSOptions returns options whose built clients talk to f, for group
// "web" in us-east-1, with retries that back off for at most a millisecond.
func fakeAWSOptions(t *testing.T, f *awsfake.Server) ASGOptions {
	return ASGOptions{
		Port:                7000,
		GroupName:           "web",
		Region:              "us-east-1",
		Config:              &sdkaws.Config{Credentials: testCredentials},
		AutoScalingEndpoint: f.URL(),
		EC2Endpoint:         f.URL(),
		RetryMaxBackoff:     time.Millisecond,
		Logger:              slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// newTestASG builds an ASG on a fake clock.
func newTestASG(t *testing.T, opts ASGOptions) (*ASG, *fakeClock) {
	t.Helper()
	a, err := NewASG(opts)
	if err != nil {
		t.Fatalf("NewASG: %v", err)
	}
	clock := newFakeClock()
	a.now = clock.Now
	return a, clock
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func mustPeers(t *testing.T, d discovery.Discoverer) []string {
	t.Helper()
	got, err := d.Peers(context.Background())
	if err != nil {
		t.Fatalf("Peers: %v", err)
	}
	return got
}

func TestAWSASGOnlyInServiceHealthy(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddGroup("api")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch("i-0b", "web", "InService", "Unhealthy", "10.0.0.2")
	f.Launch("i-0c", "web", "Pending", "Healthy", "10.0.0.3")
	f.Launch("i-0d", "web", "Terminating", "Healthy", "10.0.0.4")
	f.Launch("i-0e", "web", "Standby", "Healthy", "10.0.0.5")
	f.Launch("i-0f", "web", "InService", "Healthy", "") // no private address
	f.Launch("i-0g", "web", "InService", "Healthy", "10.0.0.7")
	f.Set("i-0g", func(in *awsfake.Instance) { in.State = "shutting-down" }) // EC2 is ahead of Auto Scaling
	f.Launch("i-09", "web", "InService", "Healthy", "10.0.0.9")
	f.Launch("i-1a", "api", "InService", "Healthy", "10.0.1.1")
	f.Launch("i-2a", "", "", "", "10.0.2.1")

	a, _ := newTestASG(t, fakeAWSOptions(t, f))
	got := mustPeers(t, a)
	if want := []string{"10.0.0.9:7000", "10.0.0.1:7000"}; !slices.Equal(got, want) {
		t.Errorf("Peers = %q, want %q (InService and Healthy with an address, sorted by instance ID)", got, want)
	}

	g, err := a.Group(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range g.Instances {
		ids = append(ids, in.ID)
	}
	if want := []string{"i-09", "i-0a", "i-0b", "i-0c", "i-0d", "i-0e", "i-0f", "i-0g"}; !slices.Equal(ids, want) {
		t.Errorf("Group.Instances = %q, want every instance of web, sorted: %q", ids, want)
	}
	if g.Name != "web" || g.Self != "" {
		t.Errorf("Group name %q self %q, want web and no self (no IMDS needed)", g.Name, g.Self)
	}
	if !g.Contains("i-0b") || !g.Contains("i-0d") || g.Contains("i-1a") || g.Contains("i-2a") {
		t.Error("Contains is wrong: want i-0b and i-0d in, i-1a and i-2a out")
	}
	for _, in := range g.Instances {
		if in.ID == "i-0b" && (in.HealthStatus != "Unhealthy" || in.LifecycleState != "InService" || in.Addr != "") {
			t.Errorf("i-0b = %+v, want InService, Unhealthy, no address", in)
		}
		if in.ID == "i-0a" && (in.PrivateIP != "10.0.0.1" || in.Addr != "10.0.0.1:7000") {
			t.Errorf("i-0a = %+v, want its private IP and address", in)
		}
	}
	if batches := f.DescribeInstancesBatches(); !slices.Equal(batches, []int{4}) {
		t.Errorf("DescribeInstances batches = %v, want one of the 4 InService, Healthy instances", batches)
	}
	if n := f.CallCount("DescribeAutoScalingInstances"); n != 0 {
		t.Errorf("DescribeAutoScalingInstances called %d times with GroupName set, want 0", n)
	}
}

func TestAWSASGBatchesAndPagination(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	const n = 2*DescribeInstancesBatch + 50
	var want []string
	for i := range n {
		id := fmt.Sprintf("i-%04d", i)
		ip := fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		f.Launch(id, "web", "InService", "Healthy", ip)
		want = append(want, ip+":7000")
	}

	a, _ := newTestASG(t, fakeAWSOptions(t, f))
	if got := mustPeers(t, a); !slices.Equal(got, want) {
		t.Errorf("Peers returned %d addresses, want all %d", len(got), len(want))
	}
	batches := f.DescribeInstancesBatches()
	total := 0
	for _, b := range batches {
		if b == 0 || b > DescribeInstancesBatch {
			t.Errorf("a DescribeInstances batch of %d IDs, want 1-%d", b, DescribeInstancesBatch)
		}
		total += b
	}
	if total != n || len(batches) != 3 {
		t.Errorf("batches %v: want 3 batches covering %d instances", batches, n)
	}
	// The fake answers at most 7 instances a page: following NextToken is
	// the only way to see them all.
	if calls := f.CallCount("DescribeInstances"); calls <= len(batches) {
		t.Errorf("%d DescribeInstances calls for %d batches: pagination was not followed", calls, len(batches))
	}
}

func TestAWSASGEmptyGroupMakesNoEC2Call(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Unhealthy", "10.0.0.1")
	f.Launch("i-0b", "web", "Pending", "Healthy", "10.0.0.2")

	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	if got := mustPeers(t, a); got == nil || len(got) != 0 {
		t.Errorf("Peers = %#v, want an empty, non-nil list", got)
	}

	// And a group with no instances at all.
	f.Terminate("i-0a")
	f.Terminate("i-0b")
	clock.Advance(2 * DefaultCacheTTL)
	if got := mustPeers(t, a); len(got) != 0 {
		t.Errorf("Peers = %q, want none", got)
	}
	if n := f.CallCount("DescribeInstances"); n != 0 {
		t.Errorf("DescribeInstances called %d times for a group without peers, want 0", n)
	}
}

func TestAWSASGThrottlingRetried(t *testing.T) {
	t.Parallel() // each spends seconds in adaptive mode's rate limiter
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	// Each throttled attempt costs about two seconds: adaptive mode slows
	// the client to its minimum rate, which is the behaviour under test.
	f.ThrottleNext("DescribeAutoScalingGroups", 1) // Throttling, as Auto Scaling says it
	f.ThrottleNext("DescribeInstances", 1)         // RequestLimitExceeded, as EC2 says it

	a, _ := newTestASG(t, fakeAWSOptions(t, f))
	if got := mustPeers(t, a); !slices.Equal(got, []string{"10.0.0.1:7000"}) {
		t.Errorf("Peers = %q", got)
	}
	for _, action := range []string{"DescribeAutoScalingGroups", "DescribeInstances"} {
		if n := f.CallCount(action); n != 2 {
			t.Errorf("%s called %d times, want 2: one throttled, one answered", action, n)
		}
	}
}

func TestAWSASGThrottlingExhausted(t *testing.T) {
	t.Parallel() // each spends seconds in adaptive mode's rate limiter
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	f.ThrottleNext("DescribeAutoScalingGroups", 2)

	opts := fakeAWSOptions(t, f)
	opts.RetryMaxAttempts = 2
	a, _ := newTestASG(t, opts)
	// Throttled more times than there are attempts: the first call fails
	// with AWS's own error ...
	_, err := a.Peers(context.Background())
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "Throttling" {
		t.Fatalf("Peers error = %v, want the Throttling API error", err)
	}
	if n := f.CallCount("DescribeAutoScalingGroups"); n != 2 {
		t.Errorf("DescribeAutoScalingGroups called %d times, want RetryMaxAttempts = 2", n)
	}
	// ... which is not cached: the next call succeeds.
	if got := mustPeers(t, a); !slices.Equal(got, []string{"10.0.0.1:7000"}) {
		t.Errorf("Peers after the throttling = %q", got)
	}
}

func TestAWSASGCache(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch("i-0b", "web", "InService", "Healthy", "10.0.0.2")

	opts := fakeAWSOptions(t, f)
	opts.CacheTTL = time.Minute
	a, clock := newTestASG(t, opts)
	first := mustPeers(t, a)
	calls := f.TotalCalls()

	// Within 80% of the TTL every answer is still alive, whatever its jitter.
	f.Terminate("i-0a")
	f.Launch("i-0c", "web", "InService", "Healthy", "10.0.0.3")
	clock.Advance(opts.CacheTTL * 79 / 100)
	for range 5 {
		if got := mustPeers(t, a); !slices.Equal(got, first) {
			t.Errorf("cached Peers = %q, want the first answer %q", got, first)
		}
		if _, err := a.Group(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.TotalCalls(); n != calls {
		t.Errorf("%d AWS calls while the cache was fresh, want none", n-calls)
	}

	// Past 120% of the TTL every answer is dead: the terminated instance
	// is gone and the new one is there.
	clock.Advance(opts.CacheTTL * 42 / 100)
	if got, want := mustPeers(t, a), []string{"10.0.0.2:7000", "10.0.0.3:7000"}; !slices.Equal(got, want) {
		t.Errorf("refreshed Peers = %q, want %q", got, want)
	}
	if n := f.TotalCalls(); n == calls {
		t.Error("no AWS call after the cache expired")
	}
	g, err := a.Group(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if g.Contains("i-0a") {
		t.Error("the terminated instance is still in the group")
	}
	if !g.FetchedAt.Equal(clock.Now()) {
		t.Errorf("FetchedAt = %v, want the refresh time %v", g.FetchedAt, clock.Now())
	}
}

func TestAWSASGCacheJitterBounds(t *testing.T) {
	for _, tt := range []struct {
		draw float64
		life time.Duration // for CacheTTL = 100s
	}{
		{0, 80 * time.Second},
		{0.5, 100 * time.Second},
		{0.999999999, 120 * time.Second},
	} {
		t.Run(fmt.Sprint(tt.draw), func(t *testing.T) {
			f := awsfake.Start(t)
			f.AddGroup("web")
			opts := fakeAWSOptions(t, f)
			opts.CacheTTL = 100 * time.Second
			a, clock := newTestASG(t, opts)
			a.rand = func() float64 { return tt.draw }
			mustPeers(t, a)
			calls := f.TotalCalls()

			clock.Advance(tt.life - time.Millisecond)
			mustPeers(t, a)
			if f.TotalCalls() != calls {
				t.Errorf("refreshed before the lifetime of %s", tt.life)
			}
			clock.Advance(time.Millisecond)
			mustPeers(t, a)
			if f.TotalCalls() == calls {
				t.Errorf("not refreshed at the end of the lifetime of %s", tt.life)
			}
		})
	}
}

func TestAWSASGConcurrentCallersShareOneRefresh(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	a, _ := newTestASG(t, fakeAWSOptions(t, f))
	const callers = 20
	waiting := make(chan struct{}, callers)
	a.onWait = func() { waiting <- struct{}{} }

	arrived, release := f.Hold()
	var started, done sync.WaitGroup // started: no caller is left unlaunched
	results := make([][]string, callers)
	errs := make([]error, callers)
	for i := range callers {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			started.Done()
			results[i], errs[i] = a.Peers(context.Background())
		}()
	}
	started.Wait()
	<-arrived // one caller's refresh is at the server and held there
	for range callers - 1 {
		<-waiting // every other caller waits for it
	}
	release()
	done.Wait()

	for i := range callers {
		if errs[i] != nil || !slices.Equal(results[i], []string{"10.0.0.1:7000"}) {
			t.Errorf("caller %d: %q, %v", i, results[i], errs[i])
		}
	}
	if n := f.CallCount("DescribeAutoScalingGroups"); n != 1 {
		t.Errorf("DescribeAutoScalingGroups called %d times by %d concurrent callers, want 1", n, callers)
	}
}

func TestAWSASGWaiterOutlivesCancelledRefresher(t *testing.T) {
	// A caller whose context ends while it refreshes for others must not
	// pass its cancellation on to them.
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	a, _ := newTestASG(t, fakeAWSOptions(t, f))
	waiting := make(chan struct{}, 2)
	a.onWait = func() { waiting <- struct{}{} }

	arrived, release := f.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() {
		_, err := a.Peers(ctx)
		firstErr <- err
	}()
	<-arrived // the first caller's refresh is in flight

	second := make(chan []string, 1)
	secondErr := make(chan error, 1)
	go func() {
		got, err := a.Peers(context.Background())
		second <- got
		secondErr <- err
	}()
	<-waiting // the second caller waits for the first one's refresh
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller got %v, want context.Canceled", err)
	}
	release()
	if got, err := <-second, <-secondErr; err != nil || !slices.Equal(got, []string{"10.0.0.1:7000"}) {
		t.Errorf("the other caller got %q, %v; want the peers", got, err)
	}
}

func TestAWSASGStale(t *testing.T) {
	for _, maxStale := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprint("MaxStale=", maxStale), func(t *testing.T) {
			f := awsfake.Start(t)
			f.AddGroup("web")
			f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
			var logs bytes.Buffer
			opts := fakeAWSOptions(t, f)
			opts.CacheTTL = time.Minute
			opts.MaxStale = maxStale
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			a, clock := newTestASG(t, opts)
			a.rand = func() float64 { return 0.5 } // a lifetime of exactly CacheTTL
			first := mustPeers(t, a)

			f.DeleteGroup("web")
			clock.Advance(90 * time.Second)
			got, err := a.Peers(context.Background())
			if maxStale == 0 {
				if !errors.Is(err, ErrGroupNotFound) {
					t.Errorf("Peers = %q, %v; want ErrGroupNotFound, never a stale answer", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, first) {
				t.Errorf("Peers = %q, %v; want the stale answer within MaxStale", got, err)
			}
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "not found") {
				t.Errorf("no warning naming the failure was logged: %q", logs.String())
			}
			calls := f.TotalCalls()
			mustPeers(t, a)
			if f.TotalCalls() == calls {
				t.Error("a stale answer was served without trying to refresh")
			}

			clock.Advance(time.Minute) // past lifetime + MaxStale
			if _, err := a.Peers(context.Background()); !errors.Is(err, ErrGroupNotFound) {
				t.Errorf("Peers past MaxStale: %v, want ErrGroupNotFound", err)
			}
		})
	}
}

func TestAWSASGGroupNotFound(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	opts := fakeAWSOptions(t, f)
	opts.GroupName = "nope"
	a, _ := newTestASG(t, opts)
	_, err := a.Peers(context.Background())
	if !errors.Is(err, ErrGroupNotFound) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Peers error = %v, want ErrGroupNotFound naming the group", err)
	}
}

func TestAWSASGCallerClients(t *testing.T) {
	// Clients the caller built and owns are used as given, with no IMDS
	// lookup when the group is named.
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	asgClient := autoscaling.New(autoscaling.Options{
		Region: "us-east-1", Credentials: testCredentials, BaseEndpoint: sdkaws.String(f.URL()),
	})
	ec2Client := ec2.New(ec2.Options{
		Region: "us-east-1", Credentials: testCredentials, BaseEndpoint: sdkaws.String(f.URL()),
	})
	a, err := NewASG(ASGOptions{Port: 7000, GroupName: "web", AutoScaling: asgClient, EC2: ec2Client})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustPeers(t, a); !slices.Equal(got, []string{"10.0.0.1:7000"}) {
		t.Errorf("Peers = %q", got)
	}
	if a.String() != "aws-asg:web" {
		t.Errorf("String = %q", a.String())
	}
}

func TestAWSOptionsValidation(t *testing.T) {
	_, err := NewASG(ASGOptions{
		Port:             70000,
		CacheTTL:         -time.Second,
		MaxStale:         -time.Second,
		RetryMaxAttempts: -1,
		RetryMaxBackoff:  -time.Second,
		GroupName:        strings.Repeat("g", 256),
		IMDSEndpoint:     "127.0.0.1:1338", // no scheme
		EC2Endpoint:      "http://127.0.0.1:1",
		EC2:              ec2.New(ec2.Options{}),
	})
	var oe *OptionsError
	if !errors.As(err, &oe) {
		t.Fatalf("NewASG error = %v, want an *OptionsError", err)
	}
	for _, want := range []string{"Port 70000", "CacheTTL -1s", "MaxStale -1s", "RetryMaxAttempts -1", "RetryMaxBackoff -1s",
		"GroupName is 256", `IMDSEndpoint "127.0.0.1:1338"`, "EC2Endpoint is set but so is EC2"} {
		if !slices.ContainsFunc(oe.Problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("no problem mentions %q; got %q", want, oe.Problems)
		}
	}
	if len(oe.Problems) != 8 {
		t.Errorf("%d problems, want 8: %q", len(oe.Problems), oe.Problems)
	}

	if _, err := NewASG(ASGOptions{Port: 7000}); err != nil {
		t.Errorf("NewASG with only a port: %v, want the defaults", err)
	}
}
