package aws

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
)

func mustDeparted(t *testing.T, a *ASG, addrs ...string) map[string]string {
	t.Helper()
	got, err := a.Departed(context.Background(), addrs)
	if err != nil {
		t.Fatalf("Departed: %v", err)
	}
	return got
}

// TestDepartedReportsTerminatingAndGone: members whose instance is
// Terminating or has left the group are reported; members of instances
// that are InService, Standby or Unhealthy, and addresses the group never
// had, are not.
func TestDepartedReportsTerminatingAndGone(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	for i, id := range []string{"i-0a", "i-0b", "i-0c", "i-0d", "i-0e"} {
		f.Launch(id, "web", "InService", "Healthy", fmt.Sprintf("10.0.0.%d", i+1))
	}
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	all := []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000", "10.0.0.5:7000"}
	foreign := []string{"10.9.9.9:7000", "witness.example:7000", "not-an-address"}
	if got := mustDeparted(t, a, append(all, foreign...)...); len(got) != 0 {
		t.Fatalf("Departed = %q, want none: every instance is InService", got)
	}

	f.Set("i-0b", func(in *awsfake.Instance) { in.Lifecycle = "Terminating:Wait" })
	f.Terminate("i-0c")
	f.Set("i-0d", func(in *awsfake.Instance) { in.Lifecycle = "Standby" })
	f.Set("i-0e", func(in *awsfake.Instance) { in.Health = "Unhealthy" })
	clock.Advance(2 * DefaultCacheTTL)
	got := mustDeparted(t, a, append(all, foreign...)...)
	if want := []string{"10.0.0.2:7000", "10.0.0.3:7000"}; !slices.Equal(slices.Sorted(maps.Keys(got)), want) {
		t.Fatalf("Departed = %q, want exactly %q (Terminating:Wait, and gone)", got, want)
	}
	if r := got["10.0.0.2:7000"]; !strings.Contains(r, "i-0b") || !strings.Contains(r, "Terminating:Wait") {
		t.Errorf("reason for i-0b = %q, want its ID and state", r)
	}
	if r := got["10.0.0.3:7000"]; !strings.Contains(r, "i-0c") || !strings.Contains(r, "no longer in") {
		t.Errorf("reason for i-0c = %q, want its ID and that it left", r)
	}
	// The member's port is not the instance's: another port at the same
	// IP is the same instance.
	if got := mustDeparted(t, a, "10.0.0.2:7390"); got["10.0.0.2:7390"] == "" {
		t.Errorf("Departed(10.0.0.2:7390) = %q, want i-0b reported at any port", got)
	}

	// Terminated, then purged from the group's list: still reported.
	f.Set("i-0b", func(in *awsfake.Instance) { in.Lifecycle = "Terminated" })
	clock.Advance(2 * DefaultCacheTTL)
	if got := mustDeparted(t, a, "10.0.0.2:7000"); !strings.Contains(got["10.0.0.2:7000"], "Terminated") {
		t.Errorf("Departed = %q, want i-0b Terminated", got)
	}
	f.Terminate("i-0b")
	clock.Advance(2 * DefaultCacheTTL)
	if got := mustDeparted(t, a, "10.0.0.2:7000"); !strings.Contains(got["10.0.0.2:7000"], "no longer in") {
		t.Errorf("Departed = %q, want i-0b gone", got)
	}
}

// TestDepartedRefreshesForNewMember: an address that the cache cannot
// place and that is newer than the cache brings one refresh forward (once
// the cache is CacheTTL/6 old), and only one.
func TestDepartedRefreshesForNewMember(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	refreshes := func() int { return f.CallCount("DescribeAutoScalingGroups") }

	// First sight of a foreign address in the call that fills the cache:
	// the answer is no older than the question, nothing to bring forward.
	mustDeparted(t, a, "10.0.0.1:7000", "10.9.9.9:7000")
	clock.Advance(DefaultCacheTTL / 6)
	mustDeparted(t, a, "10.0.0.1:7000", "10.9.9.9:7000")
	if n := refreshes(); n != 1 {
		t.Fatalf("%d refreshes, want 1: the foreign address was asked about first with the answer that could not place it", n)
	}

	// A new cache lifetime.
	clock.Advance(2 * DefaultCacheTTL)
	mustDeparted(t, a, "10.0.0.1:7000")
	if n := refreshes(); n != 2 {
		t.Fatalf("%d refreshes, want 2 once the first answer expired", n)
	}

	// A replacement joins the raft group; the cache does not know it yet.
	f.Launch("i-0b", "web", "InService", "Healthy", "10.0.0.2")
	f.Set("i-0a", func(in *awsfake.Instance) { in.Lifecycle = "Terminating" })
	clock.Advance(time.Second)
	if got := mustDeparted(t, a, "10.0.0.1:7000", "10.0.0.2:7000"); len(got) != 0 || refreshes() != 2 {
		t.Fatalf("Departed = %q after %d refreshes, want none, from the cache (younger than CacheTTL/6)", got, refreshes())
	}
	clock.Advance(DefaultCacheTTL / 6)
	got := mustDeparted(t, a, "10.0.0.1:7000", "10.0.0.2:7000")
	if n := refreshes(); n != 3 {
		t.Fatalf("%d refreshes, want 3: the new member's address brings one forward", n)
	}
	if !strings.Contains(got["10.0.0.1:7000"], "Terminating") || len(got) != 1 {
		t.Fatalf("Departed = %q, want i-0a Terminating (seen by the early refresh)", got)
	}
	// Placed now, or placed never: no more early refreshes.
	for range 3 {
		clock.Advance(DefaultCacheTTL / 6)
		mustDeparted(t, a, "10.0.0.1:7000", "10.0.0.2:7000")
	}
	if n := refreshes(); n != 3 {
		t.Fatalf("%d refreshes, want still 3 within the cache's life", n)
	}
}

// TestDepartedSinceRefreshes: a member that went quiet after the cached
// answer was fetched brings one refresh forward (once the cache is
// CacheTTL/6 old), so that its terminated instance is seen well before the
// cache expires; plain Departed keeps answering from the cache, and an
// answer newer than since is not refreshed again.
func TestDepartedSinceRefreshes(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch("i-0b", "web", "InService", "Healthy", "10.0.0.2")
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	refreshes := func() int { return f.CallCount("DescribeAutoScalingGroups") }
	addrs := []string{"10.0.0.1:7000", "10.0.0.2:7000"}
	since := func(since time.Time) map[string]string {
		t.Helper()
		got, err := a.DepartedSince(context.Background(), addrs, since)
		if err != nil {
			t.Fatalf("DepartedSince: %v", err)
		}
		return got
	}

	mustDeparted(t, a, addrs...)
	clock.Advance(time.Second)
	lastHeard := clock.Now() // i-0b's member answers, then its instance goes
	f.Terminate("i-0b")
	clock.Advance(time.Second)
	if got := since(lastHeard); len(got) != 0 || refreshes() != 1 {
		t.Fatalf("DepartedSince = %q after %d refreshes, want none, from the cache (younger than CacheTTL/6)", got, refreshes())
	}
	clock.Advance(DefaultCacheTTL / 6)
	if got := mustDeparted(t, a, addrs...); len(got) != 0 || refreshes() != 1 {
		t.Fatalf("Departed = %q after %d refreshes, want none: plain Departed answers from the cache", got, refreshes())
	}
	got := since(lastHeard)
	if n := refreshes(); n != 2 {
		t.Fatalf("%d refreshes, want 2: an answer older than since brings one forward", n)
	}
	if !strings.Contains(got["10.0.0.2:7000"], "no longer in") || len(got) != 1 {
		t.Fatalf("DepartedSince = %q, want i-0b gone", got)
	}
	for range 3 {
		clock.Advance(DefaultCacheTTL / 6)
		since(lastHeard)
	}
	if n := refreshes(); n != 2 {
		t.Fatalf("%d refreshes, want still 2: the answer is newer than since", n)
	}
}

// TestDepartedThrottled: throttling is retried with backoff; a refresh
// that fails for good is an error, not an empty answer (which would read
// as "nobody departed").
func TestDepartedThrottled(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "Terminating", "Healthy", "10.0.0.1")
	opts := fakeAWSOptions(t, f)
	a, clock := newTestASG(t, opts)
	// Place i-0a while it serves.
	f.Set("i-0a", func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	mustDeparted(t, a, "10.0.0.1:7000")
	f.Set("i-0a", func(in *awsfake.Instance) { in.Lifecycle = "Terminating" })

	clock.Advance(2 * DefaultCacheTTL)
	f.ThrottleNext("DescribeAutoScalingGroups", 2)
	if got := mustDeparted(t, a, "10.0.0.1:7000"); len(got) != 1 {
		t.Fatalf("Departed = %q, want i-0a after two throttled attempts", got)
	}

	clock.Advance(2 * DefaultCacheTTL)
	f.ThrottleNext("DescribeAutoScalingGroups", 10)
	got, err := a.Departed(context.Background(), []string{"10.0.0.1:7000"})
	if err == nil || got != nil {
		t.Fatalf("Departed = %q, %v; want an error while AWS throttles every attempt", got, err)
	}
}

// TestBootstrapExpect: it waits for min(desired capacity, 3) InService,
// Healthy instances and returns that number.
func TestBootstrapExpect(t *testing.T) {
	start := func(t *testing.T, states ...string) (*awsfake.Server, *ASG) {
		f := awsfake.Start(t)
		f.AddGroup("web")
		for i, s := range states {
			f.Launch(fmt.Sprintf("i-%02d", i), "web", s, "Healthy", fmt.Sprintf("10.0.0.%d", i+1))
		}
		opts := fakeAWSOptions(t, f)
		opts.CacheTTL = 60 * time.Millisecond // looks every 10 ms while waiting
		a, err := NewASG(opts)
		if err != nil {
			t.Fatal(err)
		}
		return f, a
	}
	expect := func(t *testing.T, a *ASG, d time.Duration) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return a.BootstrapExpect(ctx)
	}

	t.Run("waits for three", func(t *testing.T) {
		// The fake's desired capacity is the number of instances in the
		// group: 3 here.
		f, a := start(t, "InService", "Pending", "Pending")
		if n, err := expect(t, a, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("BootstrapExpect = %d, %v; want to wait while 1 of 3 is InService", n, err)
		}
		if n := f.CallCount("DescribeAutoScalingGroups"); n < 2 {
			t.Errorf("%d looks at the group while waiting, want several", n)
		}
		f.Set("i-01", func(in *awsfake.Instance) { in.Lifecycle = "InService" })
		f.Set("i-02", func(in *awsfake.Instance) { in.Lifecycle = "InService" })
		if n, err := expect(t, a, 10*time.Second); n != 3 || err != nil {
			t.Fatalf("BootstrapExpect = %d, %v; want 3", n, err)
		}
	})
	t.Run("at most three", func(t *testing.T) {
		_, a := start(t, "InService", "InService", "InService", "Pending", "Pending")
		if n, err := expect(t, a, 10*time.Second); n != 3 || err != nil {
			t.Fatalf("BootstrapExpect = %d, %v; want 3 of desired 5", n, err)
		}
	})
	t.Run("a group of one", func(t *testing.T) {
		_, a := start(t, "InService")
		if n, err := expect(t, a, 10*time.Second); n != 1 || err != nil {
			t.Fatalf("BootstrapExpect = %d, %v; want 1", n, err)
		}
	})
	t.Run("unhealthy does not count", func(t *testing.T) {
		f, a := start(t, "InService", "InService")
		f.Set("i-01", func(in *awsfake.Instance) { in.Health = "Unhealthy" })
		if n, err := expect(t, a, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("BootstrapExpect = %d, %v; want to wait for the unhealthy one", n, err)
		}
	})
	t.Run("error", func(t *testing.T) {
		f, a := start(t, "InService")
		f.DeleteGroup("web")
		if n, err := expect(t, a, 10*time.Second); !errors.Is(err, ErrGroupNotFound) {
			t.Fatalf("BootstrapExpect = %d, %v; want ErrGroupNotFound", n, err)
		}
	})
}

// steadyState simulates the raft leader of a group of n members, all
// InService and Healthy, for d of the ASG's clock: it asks Departed about
// the n-1 others every departuresEvery, as backend/raft does by default.
// It returns the calls per action that reached AWS.
func steadyState(tb testing.TB, n int, d time.Duration) map[string]int {
	const departuresEvery = 5 * time.Second
	f := awsfake.Start(tb)
	f.SetPageSize(1000) // DescribeInstances pages as AWS does with MaxResults 1000
	f.AddGroup("web")
	var others []string
	for i := range n {
		ip := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		f.Launch(fmt.Sprintf("i-%04d", i), "web", "InService", "Healthy", ip)
		if i > 0 {
			others = append(others, ip+":7390")
		}
	}
	opts := fakeAWSOptions(nil, f)
	opts.Logger = nil
	// Against the fake, which answers at once, the SDK now and then cannot
	// read a large response: it closes the request body as soon as the
	// response starts, and the transport then drops the connection under
	// the body being read (aws/aws-sdk-go-v2#2737). Such a call is
	// retried, and counted; enough attempts that no refresh fails of it.
	opts.RetryMaxAttempts = 10
	a, err := NewASG(opts)
	if err != nil {
		tb.Fatal(err)
	}
	clock := newFakeClock()
	a.now = clock.Now
	for elapsed := time.Duration(0); elapsed < d; elapsed += departuresEvery {
		if got, err := a.Departed(context.Background(), others); err != nil || len(got) != 0 {
			tb.Fatalf("Departed = %q, %v; want none", got, err)
		}
		clock.Advance(departuresEvery)
	}
	calls := map[string]int{}
	sum := 0
	for _, act := range []string{"DescribeAutoScalingGroups", "DescribeInstances", "DescribeAutoScalingInstances"} {
		calls[act] = f.CallCount(act)
		sum += calls[act]
	}
	if total := f.TotalCalls(); total != sum {
		tb.Fatalf("%d calls in all, but %v of the expected actions: something else was called", total, calls)
	}
	return calls
}

// TestDeparturesCallRate states the steady-state cost of following a group
// of 100 instances: one refresh per CacheTTL (30 s ± 20%), each one
// DescribeAutoScalingGroups and one DescribeInstances, whoever asks how
// often; about 4 calls a minute for the group.
func TestDeparturesCallRate(t *testing.T) {
	const n, hour = 100, time.Hour
	calls := steadyState(t, n, hour)
	asg, ec2 := calls["DescribeAutoScalingGroups"], calls["DescribeInstances"]
	t.Logf("group of %d over %s: %v (%.3f calls per instance per minute)", n, hour, calls, float64(asg+ec2)/n/hour.Minutes())
	// One refresh per cache lifetime, drawn within 24-36 s: 100-150 an
	// hour, plus the first; each one DescribeAutoScalingGroups and one
	// DescribeInstances (100 instances fit one batch and one page). Plus
	// the retries of responses the SDK could not read (see steadyState):
	// about a tenth against the fake.
	for _, act := range []string{"DescribeAutoScalingGroups", "DescribeInstances"} {
		if c := calls[act]; c < 100 || c > 151*3/2 {
			t.Errorf("%d %s calls in an hour, want 100-151 (one per 30 s ± 20%%), and at most half as many again in retries", c, act)
		}
	}
	if c := calls["DescribeAutoScalingInstances"]; c != 0 {
		t.Errorf("%d DescribeAutoScalingInstances calls, want none with the group named", c)
	}
	// Far below what AWS allows: EC2 refills 20 Describe tokens a second
	// (72,000 an hour) per account and region.
	if perMin := float64(asg+ec2) / n / hour.Minutes(); perMin > 0.08 {
		t.Errorf("%.3f calls per instance per minute, want at most 0.08", perMin)
	}
}
