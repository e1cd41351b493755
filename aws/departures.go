package aws

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/batonhq/baton/backend/raft"
)

// Departures and bootstrap-expect for a raft group that lives on an Auto
// Scaling group. (*ASG) implements the raft package's Departures and
// ExpectCounter interfaces (Departed, BootstrapExpect) with the same cached
// refreshes as Peers.
//
// # Call rate
//
// In a steady raft group only the raft leader calls Departed (every
// NodeOptions.DeparturesEvery, 5 s by default), and members do not call
// Peers once they are in the group. Departed answers from the ASG's cache,
// so the group costs one refresh per CacheTTL (30 s ± 20% by default):
// one DescribeAutoScalingGroups and one DescribeInstances per 100
// InService, Healthy instances. For a group of 100 instances that is about
// 2 + 2 = 4 calls a minute for the whole group, 0.04 per instance per
// minute (TestDeparturesCallRate checks it; BenchmarkSteadyStateCalls
// reports it for 3, 30 and 100). A Departed call about an address the
// cache cannot place (a member that joined since), or about a member that
// went quiet after the cached answer was fetched (DepartedSince), brings
// one refresh forward, at most one per CacheTTL/6. EC2 allows Describe* calls
// at a sustained 20 a second per account and region (a bucket of 100),
// and Auto Scaling throttles all its actions from one bucket per account
// and region; the adaptive retryer backs off when either throttles.

// An *ASG is the raft package's Departures (with DeparturesSince),
// ExpectCounter and Terminations for a group on an Auto Scaling group.
var (
	_ raft.DeparturesSince = (*ASG)(nil)
	_ raft.ExpectCounter   = (*ASG)(nil)
	_ raft.Terminations    = (*ASG)(nil)
)

// departuresFreshDiv sets the age of a cached answer after which Departed,
// asked about an address it cannot place, refreshes before answering, as a
// fraction of CacheTTL: 5 s by default.
const departuresFreshDiv = 6

// placedFor is how long after a refresh first found an instance gone from
// the group its private IP still names it: long enough for the raft leader
// to remove its member, or for a member that lost its quorum to prove it
// terminated (Terminated), short enough that the map stays the size of the
// group.
const placedFor = time.Hour

// bootstrapExpectCap caps BootstrapExpect: three voters make a group that
// survives the loss of one; more members join once it exists.
const bootstrapExpectCap = 3

// Auto Scaling's lifecycle states of an instance on its way out.
const (
	lifecycleTerminatingPrefix = "Terminating" // Terminating, Terminating:Wait, Terminating:Proceed
	lifecycleTerminated        = "Terminated"
)

// placedIP is the instance that a private IP belonged to when a refresh
// last saw it.
type placedIP struct {
	id string
	// left is when a refresh first found the instance gone from the group;
	// zero while the group lists it.
	left time.Time
}

// place records the private IPs of g's instances. The caller holds a.mu.
func (a *ASG) place(g Group, now time.Time) {
	if a.placed == nil {
		a.placed = map[string]placedIP{}
	}
	inGroup := map[string]bool{}
	for _, in := range g.Instances {
		inGroup[in.ID] = true
		if in.PrivateIP != "" {
			a.placed[in.PrivateIP] = placedIP{id: in.ID}
		}
	}
	for ip, p := range a.placed {
		switch {
		case inGroup[p.id]:
			p.left = time.Time{}
			a.placed[ip] = p
		case p.left.IsZero():
			p.left = now
			a.placed[ip] = p
		case now.Sub(p.left) > placedFor:
			delete(a.placed, ip)
		}
	}
}

// Departed reports, of the raft members' addresses given (host:port),
// those whose instance the group reports in a Terminating state or
// Terminated, or no longer lists, each with a reason. It implements the
// raft package's Departures.
//
// An address is placed by its IP: the primary private IP that a refresh
// saw for an InService, Healthy instance of the group (at any port). An
// address it cannot place, such as a member outside the group or one whose
// instance was never InService and Healthy while this ASG looked, is left
// out: not reported means not known to have departed. Pending, Standby,
// Detaching and Unhealthy instances are not reported either: they may come
// back.
//
// Answers come from the cache (see ASGOptions.CacheTTL); an address the
// cache cannot place and that is newer than the cache brings one refresh
// forward, once the cache is CacheTTL/6 old. Safe for concurrent use.
func (a *ASG) Departed(ctx context.Context, addrs []string) (map[string]string, error) {
	return a.departed(ctx, addrs, time.Time{})
}

// DepartedSince is Departed from an answer fetched after since: the raft
// leader asks it when a member has gone quiet, with the time that member
// last answered, since an answer fetched before then cannot show that its
// instance went away. A cached answer older than since is refreshed once
// it is CacheTTL/6 old, the same bound as for a new member's address, so a
// member that stays quiet without departing (cut off, not terminated)
// costs at most one refresh per CacheTTL/6 (5 s by default). It implements
// the raft package's DeparturesSince. Safe for concurrent use.
func (a *ASG) DepartedSince(ctx context.Context, addrs []string, since time.Time) (map[string]string, error) {
	return a.departed(ctx, addrs, since)
}

// departed is Departed and DepartedSince; a zero since accepts any cached
// answer.
func (a *ASG) departed(ctx context.Context, addrs []string, since time.Time) (map[string]string, error) {
	asked := a.now()
	g, err := a.get(ctx)
	if err != nil {
		return nil, err
	}
	if a.newUnplaced(addrs, asked, g.FetchedAt) || g.FetchedAt.Before(since) {
		if g, err = a.getFresh(ctx, a.opts.CacheTTL/departuresFreshDiv); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	placed := make(map[string]string, len(addrs))
	for _, addr := range addrs {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			if p, ok := a.placed[host]; ok {
				placed[addr] = p.id
			}
		}
	}
	a.mu.Unlock()

	out := map[string]string{}
	for addr, id := range placed {
		i, found := slices.BinarySearchFunc(g.Instances, id, func(in GroupInstance, id string) int { return strings.Compare(in.ID, id) })
		switch {
		case !found:
			out[addr] = fmt.Sprintf("instance %s is no longer in Auto Scaling group %s", id, g.Name)
		case strings.HasPrefix(g.Instances[i].LifecycleState, lifecycleTerminatingPrefix),
			g.Instances[i].LifecycleState == lifecycleTerminated:
			out[addr] = fmt.Sprintf("instance %s is %s in Auto Scaling group %s", id, g.Instances[i].LifecycleState, g.Name)
		}
	}
	return out, nil
}

// newUnplaced notes when each of addrs that no refresh placed was first
// asked about, forgets the addresses not asked about now, and reports
// whether one was first asked about after the answer at hand was fetched:
// that answer predates the member, so a fresher one may place it.
func (a *ASG) newUnplaced(addrs []string, asked, fetched time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unplacedSince == nil {
		a.unplacedSince = map[string]time.Time{}
	}
	newer := false
	keep := map[string]bool{}
	for _, addr := range addrs {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if _, ok := a.placed[host]; ok {
			continue
		}
		keep[addr] = true
		since, ok := a.unplacedSince[addr]
		if !ok {
			since = asked
			a.unplacedSince[addr] = since
		}
		if since.After(fetched) {
			newer = true
		}
	}
	for addr := range a.unplacedSince {
		if !keep[addr] {
			delete(a.unplacedSince, addr)
		}
	}
	return newer
}

// BootstrapExpect waits until the group has min(desired capacity, 3)
// instances (at least 1) that are InService and Healthy, the ones Peers
// returns, and returns that number. It implements the raft package's
// ExpectCounter, for --bootstrap-expect auto. While it waits it looks at
// the group every CacheTTL/6 (5 s by default, ± 20%), sharing the cache
// with Peers and Departed; an error of a refresh is returned. Safe for
// concurrent use.
func (a *ASG) BootstrapExpect(ctx context.Context) (int, error) {
	every := a.opts.CacheTTL / departuresFreshDiv
	for {
		g, err := a.getFresh(ctx, every)
		if err != nil {
			return 0, err
		}
		want := max(1, min(g.DesiredCapacity, bootstrapExpectCap))
		ready := 0
		for _, in := range g.Instances {
			if in.LifecycleState == lifecycleInService && in.HealthStatus == healthHealthy {
				ready++
			}
		}
		if ready >= want {
			return want, nil
		}
		a.log.Debug("bootstrap-expect: waiting for InService, Healthy instances", "group", g.Name, "ready", ready, "want", want, "desired", g.DesiredCapacity)
		wait := time.Duration(float64(every) * (1 - cacheJitter + 2*cacheJitter*a.rand()))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
	}
}
