package aws

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// BootstrapOrder returns the addresses of the members that bootstrap a new
// raft group on this Auto Scaling group: those of the min(desired
// capacity, 3) (at least 1) oldest-launched instances that are not
// Terminated, oldest first (launch time from EC2, then instance ID), once
// all of them are InService and Healthy; until then it returns an error
// naming what it waits for. It implements the raft package's
// BootstrapPlanner: only the member of the first, oldest instance
// bootstraps, with exactly these members.
//
// The first address is the same for every member that asks, whatever
// their cached views: an instance launched later is younger than every
// instance listed before, so the oldest instance stays the oldest until it
// is Terminated, and Pending (or Terminating, or shutting down in EC2's
// account) instances count, so one that becomes InService late cannot take
// the place of one that bootstrapped already. Two groups would need the first bootstrapper's instance, and
// every older one, to be Terminated in between (then its group is gone);
// see docs/backends/raft.md for the argument and its assumptions. It looks
// at the group through a refresh no older than CacheTTL/6 and asks EC2 for
// the launch times of the instances that are not Terminated. Safe for
// concurrent use.
func (a *ASG) BootstrapOrder(ctx context.Context) ([]string, error) {
	g, err := a.getFresh(ctx, a.opts.CacheTTL/departuresFreshDiv)
	if err != nil {
		return nil, err
	}
	var alive []GroupInstance
	for _, in := range g.Instances {
		if in.LifecycleState != "Terminated" {
			alive = append(alive, in)
		}
	}
	ids := make([]string, len(alive))
	for i, in := range alive {
		ids[i] = in.ID
	}
	launched, err := a.launches.get(ids, func(missing []string) (map[string]launchState, error) {
		return a.launchTimes(ctx, missing)
	})
	if err != nil {
		return nil, err
	}
	var unknown []string
	for _, in := range alive {
		// An instance EC2 reports shutting down still counts while the
		// group lists it: a view cached before may still see it running
		// and first, so the order waits for the group to report it
		// Terminated rather than name the next one first.
		if _, ok := launched[in.ID]; !ok {
			// EC2 does not describe it yet (eventual consistency): it
			// may be older than the ones it knows.
			unknown = append(unknown, in.ID)
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("EC2 does not describe instances %s of group %q yet", strings.Join(unknown, ", "), g.Name)
	}
	slices.SortFunc(alive, func(x, y GroupInstance) int {
		if c := launched[x.ID].at.Compare(launched[y.ID].at); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
	want := max(1, min(g.DesiredCapacity, bootstrapExpectCap))
	if len(alive) < want {
		return nil, fmt.Errorf("group %q has %d instances that are not terminated, of %d to bootstrap with (desired capacity %d)", g.Name, len(alive), want, g.DesiredCapacity)
	}
	var addrs, waiting []string
	for _, in := range alive[:want] {
		if launched[in.ID].gone {
			waiting = append(waiting, fmt.Sprintf("%s (%s, shutting down: until the group reports it Terminated)", in.ID, in.LifecycleState))
			continue
		}
		if in.Addr == "" {
			waiting = append(waiting, fmt.Sprintf("%s (%s, %s)", in.ID, in.LifecycleState, in.HealthStatus))
			continue
		}
		addrs = append(addrs, in.Addr)
	}
	if len(waiting) > 0 {
		return nil, fmt.Errorf("waiting for the oldest instances of group %q to be InService and Healthy: %s", g.Name, strings.Join(waiting, ", "))
	}
	return addrs, nil
}

// launchState is what EC2 says of an instance for BootstrapOrder.
type launchState struct {
	at   time.Time
	gone bool // shutting-down or terminated
}

// launchTimes asks EC2 for the launch time and state of each of ids, in
// batches of at most DescribeInstancesBatch. Instances EC2 does not
// describe are absent.
func (a *ASG) launchTimes(ctx context.Context, ids []string) (map[string]launchState, error) {
	out := make(map[string]launchState, len(ids))
	err := eachInstance(ctx, a.ec2API, "instance-id", ids, fmt.Sprintf("launch times, group %q", a.group), func(in ec2types.Instance) {
		if id := sdkaws.ToString(in.InstanceId); id != "" && in.LaunchTime != nil {
			out[id] = launchState{at: *in.LaunchTime, gone: !liveState(in.State)}
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// launchCache keeps the launch times EC2 reported, which never change, so
// that a member waiting to bootstrap asks EC2 only about instances it has
// not seen. An instance seen running stays so here even once EC2 reports
// it shutting down: it then counts as the oldest a little longer (until
// the group reports it Terminated), which delays a bootstrap, never
// doubles one. Safe for concurrent use.
type launchCache struct {
	mu sync.Mutex
	m  map[string]launchState
}

// get returns the launch states of ids, asking fetch about those it does
// not hold; instances fetch does not describe are absent.
func (c *launchCache) get(ids []string, fetch func([]string) (map[string]launchState, error)) (map[string]launchState, error) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]launchState{}
	}
	out := make(map[string]launchState, len(ids))
	var missing []string
	for _, id := range ids {
		if s, ok := c.m[id]; ok {
			out[id] = s
		} else {
			missing = append(missing, id)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	got, err := fetch(missing)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, s := range got {
		out[id] = s
		if !s.gone {
			c.m[id] = s
		}
	}
	return out, nil
}
