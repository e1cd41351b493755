package aws

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// Proof that raft members are gone for good, for a group that has lost its
// quorum (the raft package's Terminations).
//
// Only EC2's own word counts: an instance whose state is terminated never
// runs again, so a member that ran on it can never vote again. Nothing
// weaker is taken: Auto Scaling's Terminating and Terminating:Wait (the
// instance still runs while a lifecycle hook waits), an instance absent
// from the group (a detached instance still runs), stopped (it may be
// started again), or silent (a partition looks the same).

// Place makes sure the ASG can later name the instance behind each of
// addrs (host:port): an address that no refresh has placed brings one
// refresh forward, at most one per CacheTTL/6. Members call it when their
// configuration changes, while the instances still run: a terminated
// instance no longer has its private IP, so an address must be placed
// before its instance goes. It implements part of the raft package's
// Terminations. Safe for concurrent use.
//
// It returns an error naming the addresses it still cannot place (a member
// whose instance a refresh has not yet seen InService and Healthy, or one
// outside the group, such as a witness): the caller asks again later.
func (a *ASG) Place(ctx context.Context, addrs []string) error {
	if len(a.unplaced(addrs)) == 0 {
		return nil
	}
	if _, err := a.getFresh(ctx, a.opts.CacheTTL/departuresFreshDiv); err != nil {
		return err
	}
	if left := a.unplaced(addrs); len(left) > 0 {
		return fmt.Errorf("discovery: no refresh has seen an InService, Healthy instance of group %s at %s yet", a.group, strings.Join(left, ", "))
	}
	return nil
}

// unplaced returns those of addrs whose IP no refresh has placed.
func (a *ASG) unplaced(addrs []string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, addr := range addrs {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if _, ok := a.placed[host]; !ok {
			out = append(out, addr)
		}
	}
	return out
}

// Terminated reports, of the raft members' addresses given (host:port),
// those whose instance EC2 reports terminated now, each with a reason. It
// implements part of the raft package's Terminations.
//
// An address is placed on its instance by the refreshes that saw it
// InService and Healthy (see Place). The instance's state is then asked of
// EC2 at every call, never taken from the cache: a DescribeInstances
// filtered on the instance IDs, and one filtered on the addresses' IPs. An
// address is reported only when its instance is terminated and no other
// instance that is not terminated holds its IP now (EC2 may give a
// terminated instance's IP to a new one, and a member there is not the
// lost one's word to take). An address it cannot place, or whose instance
// EC2 no longer lists (purged, about an hour after termination), is left
// out: not reported means not proven terminated. Safe for concurrent use.
func (a *ASG) Terminated(ctx context.Context, addrs []string) (map[string]string, error) {
	a.mu.Lock()
	placed := map[string]string{} // addr -> instance ID
	for _, addr := range addrs {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			if p, ok := a.placed[host]; ok {
				placed[addr] = p.id
			}
		}
	}
	// Placements exist only after a refresh, which sets the client first.
	api := a.ec2API
	a.mu.Unlock()
	out := map[string]string{}
	if len(placed) == 0 {
		return out, nil
	}
	var ids, ips []string
	for addr, id := range placed {
		ids = append(ids, id)
		host, _, _ := net.SplitHostPort(addr)
		ips = append(ips, host)
	}
	slices.Sort(ids)
	slices.Sort(ips)
	byID, err := describeStates(ctx, api, "instance-id", slices.Compact(ids))
	if err != nil {
		return nil, err
	}
	byIP, err := describeStates(ctx, api, "private-ip-address", slices.Compact(ips))
	if err != nil {
		return nil, err
	}
	for addr, id := range placed {
		st, ok := byID[id]
		if !ok || st.state != ec2types.InstanceStateNameTerminated {
			continue
		}
		host, _, _ := net.SplitHostPort(addr)
		if other, ok := byIP[host]; ok && other.id != id && other.state != ec2types.InstanceStateNameTerminated {
			a.log.Info("an instance that is not terminated now holds the private IP of a terminated one: not proof that the member there is gone",
				"addr", addr, "terminated", id, "holder", other.id, "state", other.state)
			continue
		}
		out[addr] = fmt.Sprintf("instance %s is terminated (EC2, asked at %s)", id, time.Now().UTC().Format(time.RFC3339))
	}
	return out, nil
}

// ec2State is one instance's EC2 state, as one DescribeInstances saw it.
type ec2State struct {
	id    string
	state ec2types.InstanceStateName
}

// describeStates asks EC2 for the state of the instances that filter name
// selects with values, keyed by instance ID (name "instance-id") or by
// private IP.
func describeStates(ctx context.Context, api EC2API, name string, values []string) (map[string]ec2State, error) {
	out := map[string]ec2State{}
	err := eachInstance(ctx, api, name, values, name, func(in ec2types.Instance) {
		s := ec2State{id: sdkaws.ToString(in.InstanceId)}
		if in.State != nil {
			s.state = in.State.Name
		}
		key := s.id
		if name != "instance-id" {
			key = sdkaws.ToString(in.PrivateIpAddress)
			if prev, ok := out[key]; ok && prev.state != ec2types.InstanceStateNameTerminated {
				return // a live holder of the IP wins over a terminated one
			}
		}
		if key != "" {
			out[key] = s
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachInstance calls fn with every instance that the DescribeInstances
// filter name selects with values, asking in batches of at most
// DescribeInstancesBatch values and following every page. A filter rather
// than InstanceIds: an instance terminated and purged since is then simply
// absent, where InstanceIds would fail the whole request with
// InvalidInstanceID.NotFound. With no values it makes no request: an empty
// filter would describe every instance in the account's region. what names
// the call in its errors.
func eachInstance(ctx context.Context, api EC2API, name string, values []string, what string, fn func(ec2types.Instance)) error {
	for batch := range slices.Chunk(values, DescribeInstancesBatch) {
		pages := ec2.NewDescribeInstancesPaginator(api, &ec2.DescribeInstancesInput{
			Filters:    []ec2types.Filter{{Name: sdkaws.String(name), Values: batch}},
			MaxResults: sdkaws.Int32(1000),
		})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				return fmt.Errorf("discovery: DescribeInstances (%s of %d instances): %w", what, len(batch), err)
			}
			for _, r := range page.Reservations {
				for _, in := range r.Instances {
					fn(in)
				}
			}
		}
	}
	return nil
}
