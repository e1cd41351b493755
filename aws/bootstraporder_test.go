package aws

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
)

// BootstrapOrder names the min(desired capacity, 3) oldest-launched
// instances that are not Terminated, oldest first, whatever their IDs; it
// waits (an error naming them) while one of them is not InService and
// Healthy, Pending and Terminating ones included; Terminated ones drop out;
// and it asks EC2 about each instance's launch time once.
func TestBootstrapOrder(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.SetDesired("web", 5)
	// Launch order z, y, x, w, v; IDs sort the other way.
	for _, in := range []struct{ id, ip, state string }{
		{"i-0z", "10.0.0.1", "Pending"},
		{"i-0y", "10.0.0.2", "InService"},
		{"i-0x", "10.0.0.3", "InService"},
		{"i-0w", "10.0.0.4", "InService"},
		{"i-0v", "10.0.0.5", "InService"},
	} {
		f.Launch(in.id, "web", in.state, "Healthy", in.ip)
	}
	a, clock := newTestASG(t, fakeAWSOptions(t, f))
	order := func() ([]string, error) {
		clock.Advance(time.Hour) // past the cache, which is not what this tests
		return a.BootstrapOrder(context.Background())
	}
	if got, err := order(); err == nil || !strings.Contains(err.Error(), "i-0z (Pending, Healthy)") {
		t.Fatalf("with the oldest instance Pending: %v, %v; want to wait for i-0z", got, err)
	}
	f.Set("i-0z", func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	got, err := order()
	if want := []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("BootstrapOrder = %v, %v; want %v (launch order, not ID order)", got, err, want)
	}
	calls := f.CallCount("DescribeInstances")

	f.Set("i-0z", func(in *awsfake.Instance) { in.Lifecycle = "Terminating" })
	if got, err := order(); err == nil || !strings.Contains(err.Error(), "i-0z (Terminating") {
		t.Fatalf("with the oldest instance Terminating: %v, %v; want to wait for it", got, err)
	}
	f.Terminate("i-0z")
	got, err = order()
	if want := []string{"10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("once the oldest is Terminated: %v, %v; want %v", got, err, want)
	}
	f.SetDesired("web", 2)
	got, err = order()
	if want := []string{"10.0.0.2:7000", "10.0.0.3:7000"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("at desired capacity 2: %v, %v; want %v", got, err, want)
	}
	// Refreshes for Peers ask about InService instances; the launch
	// times were asked once.
	if n := f.CallCount("DescribeInstances") - calls; n > 4 {
		t.Errorf("%d DescribeInstances calls over four more orders, want only the refreshes' (launch times cached)", n)
	}
}

// An instance that EC2 reports shutting down while the Auto Scaling group
// still lists it (Terminating, or InService before its health check
// catches up) is waited for, not dropped: another member's view, cached
// before, may still see it running and first, and would let it bootstrap
// while this view named the next one first. The order moves on only once
// the group reports it Terminated.
func TestBootstrapOrderWaitsForShuttingDown(t *testing.T) {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.SetDesired("web", 3)
	for _, in := range []struct{ id, ip string }{{"i-0z", "10.0.0.1"}, {"i-0y", "10.0.0.2"}, {"i-0x", "10.0.0.3"}, {"i-0w", "10.0.0.4"}} {
		f.Launch(in.id, "web", "InService", "Healthy", in.ip)
	}
	// One member's view, seen with i-0z running: i-0z bootstraps.
	cached, cachedClock := newTestASG(t, fakeAWSOptions(t, f))
	cachedClock.Advance(time.Hour)
	if got, err := cached.BootstrapOrder(context.Background()); err != nil || len(got) == 0 || got[0] != "10.0.0.1:7000" {
		t.Fatalf("before the shutdown: %v, %v; want i-0z first", got, err)
	}
	for _, lifecycle := range []string{"InService", "Terminating"} {
		f.Set("i-0z", func(in *awsfake.Instance) { in.State, in.Lifecycle = "shutting-down", lifecycle })
		// Another member's first look, with i-0z already shutting down.
		fresh, clock := newTestASG(t, fakeAWSOptions(t, f))
		clock.Advance(time.Hour)
		if got, err := fresh.BootstrapOrder(context.Background()); err == nil || !strings.Contains(err.Error(), "i-0z") {
			t.Fatalf("i-0z shutting down, %s in the group: %v, %v; want to wait for i-0z, which another view still names first", lifecycle, got, err)
		}
	}
	f.Terminate("i-0z")
	fresh, clock := newTestASG(t, fakeAWSOptions(t, f))
	clock.Advance(time.Hour)
	got, err := fresh.BootstrapOrder(context.Background())
	if want := []string{"10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("once i-0z is Terminated: %v, %v; want %v", got, err, want)
	}
}
