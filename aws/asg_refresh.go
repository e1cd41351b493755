package aws

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// get returns the cached answer while it lives, or joins or starts a
// refresh. The returned Group is shared: callers must not modify it.
func (a *ASG) get(ctx context.Context) (Group, error) { return a.getFresh(ctx, 0) }

// getFresh is get, but also refreshes a cached answer that is maxAge old
// or older; 0 means no bound beyond the answer's lifetime.
func (a *ASG) getFresh(ctx context.Context, maxAge time.Duration) (Group, error) {
	for {
		a.mu.Lock()
		if now := a.now(); a.cur != nil && now.Before(a.expires) && (maxAge <= 0 || now.Sub(a.cur.FetchedAt) < maxAge) {
			g := *a.cur
			a.mu.Unlock()
			return g, nil
		}
		if f := a.flight; f != nil {
			a.mu.Unlock()
			if a.onWait != nil {
				a.onWait()
			}
			select {
			case <-f.done:
			case <-ctx.Done():
				return Group{}, ctx.Err()
			}
			if f.callerGone && ctx.Err() == nil {
				// The refresh died with its caller's context, which says
				// nothing about AWS; try again under ours.
				continue
			}
			return f.g, f.err
		}
		f := &flight{done: make(chan struct{})}
		a.flight = f
		a.mu.Unlock()

		return a.lead(ctx, f)
	}
}

// lead runs the refresh f for every caller waiting on it, and publishes the
// result, even if the refresh panics (a caller's client may), so that no
// waiter is left hanging.
func (a *ASG) lead(ctx context.Context, f *flight) (g Group, err error) {
	err = errors.New("discovery: the Auto Scaling refresh panicked")
	defer func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.flight = nil
		now := a.now()
		switch {
		case err == nil:
			g.FetchedAt = now
			a.cur = &g
			life := time.Duration(float64(a.opts.CacheTTL) * (1 - cacheJitter + 2*cacheJitter*a.rand()))
			a.expires = now.Add(life)
			a.place(g, now)
		case a.cur != nil && a.opts.MaxStale > 0 && now.Before(a.expires.Add(a.opts.MaxStale)) && ctx.Err() == nil:
			// Serve the old answer without extending its life, so that the
			// next call tries to refresh again.
			a.log.Warn("refresh failed; serving the previous answer",
				"group", a.cur.Name, "age", now.Sub(a.cur.FetchedAt), "err", err)
			g, err = *a.cur, nil
		}
		f.g, f.err, f.callerGone = g, err, ctx.Err() != nil
		close(f.done)
	}()
	g, err = a.refresh(ctx)
	return g, err
}

// refresh asks AWS for the group's state. Only one refresh runs at a time.
func (a *ASG) refresh(ctx context.Context) (Group, error) {
	if err := a.init(ctx); err != nil {
		return Group{}, err
	}
	g := Group{Name: a.group, Self: a.self}

	var members []string
	pages := autoscaling.NewDescribeAutoScalingGroupsPaginator(a.asgAPI, &autoscaling.DescribeAutoScalingGroupsInput{
		AutoScalingGroupNames: []string{a.group},
	})
	found := false
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return Group{}, fmt.Errorf("discovery: DescribeAutoScalingGroups %q: %w", a.group, err)
		}
		for _, grp := range page.AutoScalingGroups {
			if sdkaws.ToString(grp.AutoScalingGroupName) != a.group {
				continue
			}
			found = true
			g.DesiredCapacity = int(sdkaws.ToInt32(grp.DesiredCapacity))
			for _, in := range grp.Instances {
				id := sdkaws.ToString(in.InstanceId)
				if id == "" {
					continue
				}
				inst := GroupInstance{ID: id, LifecycleState: string(in.LifecycleState), HealthStatus: sdkaws.ToString(in.HealthStatus)}
				g.Instances = append(g.Instances, inst)
				if inst.LifecycleState == lifecycleInService && inst.HealthStatus == healthHealthy {
					members = append(members, id)
				}
			}
		}
	}
	if !found {
		return Group{}, fmt.Errorf("%w: %q", ErrGroupNotFound, a.group)
	}
	slices.SortFunc(g.Instances, func(x, y GroupInstance) int { return strings.Compare(x.ID, y.ID) })
	g.Instances = slices.CompactFunc(g.Instances, func(x, y GroupInstance) bool { return x.ID == y.ID })

	ips, err := a.privateIPs(ctx, members)
	if err != nil {
		return Group{}, err
	}
	port := strconv.Itoa(a.opts.Port)
	for i, in := range g.Instances {
		if ip, ok := ips[in.ID]; ok && in.LifecycleState == lifecycleInService && in.HealthStatus == healthHealthy {
			g.Instances[i].PrivateIP = ip
			g.Instances[i].Addr = net.JoinHostPort(ip, port)
		}
	}
	a.log.Debug("refreshed", "group", a.group, "instances", len(g.Instances), "members", len(members), "addresses", len(ips))
	return g, nil
}

// privateIPs returns the primary private IP of each of ids that EC2 reports
// pending or running, asking in batches of at most DescribeInstancesBatch
// IDs. With no ids it makes no request: an empty filter would describe every
// instance in the account's region.
func (a *ASG) privateIPs(ctx context.Context, ids []string) (map[string]string, error) {
	ips := make(map[string]string, len(ids))
	err := eachInstance(ctx, a.ec2API, "instance-id", ids, fmt.Sprintf("private IPs, group %q", a.group), func(in ec2types.Instance) {
		if id, ip := sdkaws.ToString(in.InstanceId), sdkaws.ToString(in.PrivateIpAddress); id != "" && ip != "" && liveState(in.State) {
			ips[id] = ip
		}
	})
	if err != nil {
		return nil, err
	}
	return ips, nil
}

// liveState reports whether an EC2 instance state may serve: pending or
// running, or unknown (a response without a state).
func liveState(s *ec2types.InstanceState) bool {
	if s == nil {
		return true
	}
	switch s.Name {
	case ec2types.InstanceStateNamePending, ec2types.InstanceStateNameRunning, "":
		return true
	}
	return false
}

// init builds the clients and finds the group, once: a failure is retried
// by the next refresh.
func (a *ASG) init(ctx context.Context) error {
	if a.ready {
		return nil
	}
	o := &a.opts
	needIdentity := o.GroupName == "" || (o.Region == "" && (o.AutoScaling == nil || o.EC2 == nil))
	needConfig := (needIdentity && o.IMDS == nil) || o.AutoScaling == nil || o.EC2 == nil

	var cfg sdkaws.Config
	if needConfig {
		if o.Config != nil {
			cfg = o.Config.Copy()
		} else {
			var err error
			if cfg, err = config.LoadDefaultConfig(ctx); err != nil {
				return fmt.Errorf("discovery: loading the AWS configuration: %w", err)
			}
		}
	}

	self, region := "", o.Region
	if needIdentity {
		client := o.IMDS
		if client == nil {
			client = imds.NewFromConfig(cfg, func(io *imds.Options) {
				// Fail closed: an instance whose metadata service refuses
				// tokens gets an error, never the unauthenticated IMDSv1.
				io.EnableFallback = sdkaws.FalseTernary
				if o.IMDSEndpoint != "" {
					io.Endpoint = o.IMDSEndpoint
				}
			})
		}
		doc, err := client.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{})
		if err != nil {
			return fmt.Errorf("%w (there is no fallback to IMDSv1; in a container the instance's HttpPutResponseHopLimit must be at least 2): %w", ErrIdentity, err)
		}
		if doc.InstanceID == "" {
			return fmt.Errorf("%w: the identity document has no instance ID", ErrIdentity)
		}
		self = doc.InstanceID
		if region == "" {
			region = doc.Region
		}
	}
	if region == "" && (o.AutoScaling == nil || o.EC2 == nil) {
		return fmt.Errorf("%w: the identity document names no region; set ASGOptions.Region", ErrIdentity)
	}

	asgAPI, ec2API := o.AutoScaling, o.EC2
	if asgAPI == nil {
		asgAPI = autoscaling.NewFromConfig(cfg, func(ao *autoscaling.Options) {
			ao.Region = region
			ao.Retryer = a.retryer()
			ao.RetryMaxAttempts = 0 // the retryer above already counts them
			if o.AutoScalingEndpoint != "" {
				ao.BaseEndpoint = sdkaws.String(o.AutoScalingEndpoint)
			}
		})
	}
	if ec2API == nil {
		ec2API = ec2.NewFromConfig(cfg, func(eo *ec2.Options) {
			eo.Region = region
			eo.Retryer = a.retryer()
			eo.RetryMaxAttempts = 0
			if o.EC2Endpoint != "" {
				eo.BaseEndpoint = sdkaws.String(o.EC2Endpoint)
			}
		})
	}

	group := o.GroupName
	if group == "" {
		var err error
		if group, err = ownGroup(ctx, asgAPI, self); err != nil {
			return err
		}
	}
	a.log.Debug("initialised", "instance", self, "region", region, "group", group)
	a.self, a.group, a.asgAPI, a.ec2API, a.ready = self, group, asgAPI, ec2API, true
	return nil
}

// retryer returns a new adaptive-mode retryer: its client-side rate limit
// adapts to throttling, so each client gets its own.
func (a *ASG) retryer() sdkaws.Retryer {
	return retry.NewAdaptiveMode(func(ao *retry.AdaptiveModeOptions) {
		ao.StandardOptions = append(ao.StandardOptions, func(so *retry.StandardOptions) {
			so.MaxAttempts = a.opts.RetryMaxAttempts
			so.MaxBackoff = a.opts.RetryMaxBackoff
		})
	})
}

// ownGroup returns the name of the Auto Scaling group that lists instance
// id.
func ownGroup(ctx context.Context, client ASGAPI, id string) (string, error) {
	out, err := client.DescribeAutoScalingInstances(ctx, &autoscaling.DescribeAutoScalingInstancesInput{
		InstanceIds: []string{id},
	})
	if err != nil {
		return "", fmt.Errorf("discovery: DescribeAutoScalingInstances %s: %w", id, err)
	}
	for _, in := range out.AutoScalingInstances {
		if sdkaws.ToString(in.InstanceId) == id && sdkaws.ToString(in.AutoScalingGroupName) != "" {
			return sdkaws.ToString(in.AutoScalingGroupName), nil
		}
	}
	return "", fmt.Errorf("%w: instance %s", ErrNotInGroup, id)
}
