package aws

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
)

func mustTerminated(t *testing.T, a *ASG, addrs ...string) map[string]string {
	t.Helper()
	got, err := a.Terminated(context.Background(), addrs)
	if err != nil {
		t.Fatalf("Terminated: %v", err)
	}
	return got
}

// TestTerminatedOnlyOnEC2Terminated: only an instance whose EC2 state is
// terminated is proof. An instance that the group shows Terminating:Wait or
// Terminated (its lifecycle hook holds it, still running), one detached
// from the group (still running), one stopped, and one the group's cached
// view shows gone but that runs: none is reported. The proof is asked of
// EC2 at every call, never taken from the cache.
func TestTerminatedOnlyOnEC2Terminated(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	ids := []string{"i-0a", "i-0b", "i-0c", "i-0d", "i-0e", "i-0f"}
	var addrs []string
	for i, id := range ids {
		f.Launch(id, "web", "InService", "Healthy", fmt.Sprintf("10.0.0.%d", i+1))
		addrs = append(addrs, fmt.Sprintf("10.0.0.%d:7390", i+1))
	}
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	if err := a.Place(context.Background(), addrs); err != nil {
		t.Fatalf("Place: %v", err)
	}
	if got := mustTerminated(t, a, addrs...); len(got) != 0 {
		t.Fatalf("Terminated = %q, want none: every instance runs", got)
	}

	f.Set("i-0a", func(in *awsfake.Instance) { in.Lifecycle = "Terminating:Wait" })
	f.Set("i-0b", func(in *awsfake.Instance) { in.Lifecycle = "Terminated" }) // the group's word, EC2 still running
	f.Set("i-0c", func(in *awsfake.Instance) { in.Group = "" })               // detached
	f.Set("i-0d", func(in *awsfake.Instance) { in.State = "stopped" })
	f.Terminate("i-0e")
	// The cache now says i-0a and i-0b are on their way out and i-0c is
	// gone: Departed's word, never Terminated's.
	clock.Advance(2 * DefaultCacheTTL)
	if d := mustDeparted(t, a, addrs...); len(d) < 3 {
		t.Fatalf("Departed = %q: the cached view should report i-0a, i-0b, i-0c", d)
	}
	before := f.CallCount("DescribeInstances")
	got := mustTerminated(t, a, addrs...)
	if want := []string{"10.0.0.5:7390"}; !slices.Equal(slices.Sorted(maps.Keys(got)), want) {
		t.Fatalf("Terminated = %q, want exactly %q (EC2 state terminated)", got, want)
	}
	if r := got["10.0.0.5:7390"]; !strings.Contains(r, "i-0e") || !strings.Contains(r, "terminated") {
		t.Errorf("reason = %q, want the instance and its state", r)
	}
	if n := f.CallCount("DescribeInstances") - before; n < 2 {
		t.Errorf("Terminated made %d DescribeInstances calls, want at least 2 (by instance, by IP): it must ask EC2, not the cache", n)
	}
	// Asked again with nothing changed: EC2 is asked again.
	before = f.CallCount("DescribeInstances")
	mustTerminated(t, a, addrs...)
	if f.CallCount("DescribeInstances") == before {
		t.Errorf("a second Terminated answered without asking EC2")
	}
	// An address no refresh placed is never reported.
	if got := mustTerminated(t, a, "10.9.9.9:7390", "bad"); len(got) != 0 {
		t.Errorf("Terminated(unplaced) = %q, want none", got)
	}
}

// TestTerminatedNotWhenIPReused: EC2 gave a terminated instance's private
// IP to a new instance, which runs. A member at that address may be the
// new instance's: the old instance's termination proves nothing about it.
func TestTerminatedNotWhenIPReused(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	if err := a.Place(context.Background(), []string{"10.0.0.1:7390"}); err != nil {
		t.Fatal(err)
	}
	f.Terminate("i-0a")
	if got := mustTerminated(t, a, "10.0.0.1:7390"); len(got) != 1 {
		t.Fatalf("Terminated = %q, want i-0a's address", got)
	}
	f.Launch("i-0b", "", "", "", "10.0.0.1")
	clock.Advance(time.Second)
	if got := mustTerminated(t, a, "10.0.0.1:7390"); len(got) != 0 {
		t.Fatalf("Terminated = %q, want none: a running instance holds the IP now", got)
	}
}

// TestPlaceKeepsLostInstances: a member's address placed while its
// instance ran still names it after the instance has left the group, so
// that its termination can be proven later, even when the last refresh
// that saw it is older than placedFor.
func TestPlaceKeepsLostInstances(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch("i-0b", "web", "InService", "Healthy", "10.0.0.2")
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	if err := a.Place(context.Background(), []string{"10.0.0.1:7390", "10.0.0.2:7390"}); err != nil {
		t.Fatal(err)
	}
	calls := f.TotalCalls()
	// Placed already: no call.
	if err := a.Place(context.Background(), []string{"10.0.0.1:7390"}); err != nil {
		t.Fatal(err)
	}
	if f.TotalCalls() != calls {
		t.Errorf("Place of placed addresses called AWS")
	}
	clock.Advance(2 * placedFor)
	f.Terminate("i-0a")
	// A refresh long after the one that placed i-0a: i-0a left the group
	// just now, so its IP still names it.
	if _, err := a.Peers(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := mustTerminated(t, a, "10.0.0.1:7390"); len(got) != 1 {
		t.Fatalf("Terminated = %q, want i-0a's address", got)
	}
}

// TestPlaceReportsWhatItCannotPlace: a member whose instance launched after
// a recent refresh is not placed by it: Place says so (the caller asks
// again), and places it once a refresh is due.
func TestPlaceReportsWhatItCannotPlace(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	if err := a.Place(context.Background(), []string{"10.0.0.1:7390"}); err != nil {
		t.Fatal(err)
	}
	f.Launch("i-0b", "web", "InService", "Healthy", "10.0.0.2")
	err := a.Place(context.Background(), []string{"10.0.0.1:7390", "10.0.0.2:7390"})
	if err == nil || !strings.Contains(err.Error(), "10.0.0.2:7390") {
		t.Fatalf("Place right after a refresh = %v, want an error naming 10.0.0.2:7390", err)
	}
	clock.Advance(DefaultCacheTTL / departuresFreshDiv)
	if err := a.Place(context.Background(), []string{"10.0.0.1:7390", "10.0.0.2:7390"}); err != nil {
		t.Fatalf("Place once a refresh is due: %v", err)
	}
	f.Terminate("i-0b")
	if got := mustTerminated(t, a, "10.0.0.2:7390"); len(got) != 1 {
		t.Fatalf("Terminated = %q, want i-0b's address", got)
	}
}
