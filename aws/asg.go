package aws

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/batonhq/baton/discovery"
)

// ASGAPI is the part of the Auto Scaling client that NewASG uses.
// *autoscaling.Client implements it.
type ASGAPI interface {
	DescribeAutoScalingInstances(ctx context.Context, in *autoscaling.DescribeAutoScalingInstancesInput, optFns ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingInstancesOutput, error)
	DescribeAutoScalingGroups(ctx context.Context, in *autoscaling.DescribeAutoScalingGroupsInput, optFns ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
}

// EC2API is the part of the EC2 client that NewASG uses. *ec2.Client
// implements it.
type EC2API interface {
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, optFns ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

// IMDSAPI is the part of the instance metadata client that NewASG uses.
// *imds.Client implements it.
type IMDSAPI interface {
	GetInstanceIdentityDocument(ctx context.Context, in *imds.GetInstanceIdentityDocumentInput, optFns ...func(*imds.Options)) (*imds.GetInstanceIdentityDocumentOutput, error)
}

var (
	_ ASGAPI               = (*autoscaling.Client)(nil)
	_ EC2API               = (*ec2.Client)(nil)
	_ IMDSAPI              = (*imds.Client)(nil)
	_ discovery.Discoverer = (*ASG)(nil)
)

// Defaults of ASGOptions, applied when a field is zero.
const (
	// DefaultCacheTTL is the default ASGOptions.CacheTTL.
	DefaultCacheTTL = 30 * time.Second

	// DefaultRetryMaxAttempts is the default ASGOptions.RetryMaxAttempts:
	// the SDK's own default, one call and two retries.
	DefaultRetryMaxAttempts = retry.DefaultMaxAttempts

	// DefaultRetryMaxBackoff is the default ASGOptions.RetryMaxBackoff, the
	// SDK's own default.
	DefaultRetryMaxBackoff = retry.DefaultMaxBackoff
)

// DescribeInstancesBatch is the most instance IDs NewASG puts in one
// DescribeInstances request. It stays below the EC2 limit of 200 values in
// a filter.
const DescribeInstancesBatch = 100

// cacheJitter is the fraction by which each cache lifetime is drawn above or
// below CacheTTL, so that instances started together spread their calls.
const cacheJitter = 0.2

// Auto Scaling's words for the state of a peer.
const (
	lifecycleInService = "InService"
	healthHealthy      = "Healthy"
)

// ASGOptions configures NewASG. The zero value is invalid only in Port, which
// has no sensible default; every other zero field means the default that
// its documentation names.
type ASGOptions struct {
	// Port is the port the peers listen on: Peers returns
	// "PRIVATE-IP:Port". Required, in 1-65535.
	Port int

	// GroupName names the Auto Scaling group whose members are the peers.
	// Empty (the default) means the group this instance belongs to, found by
	// reading the instance ID from IMDSv2 and calling
	// DescribeAutoScalingInstances once.
	GroupName string

	// Region is the AWS region of the group. Empty (the default) means the
	// region in this instance's identity document, read from IMDSv2; the
	// region of Config is not used. It applies only to clients that NewASG
	// builds.
	Region string

	// CacheTTL is how long Peers and Group serve one answer before asking
	// AWS again. Each answer's lifetime is drawn uniformly within ±20% of
	// CacheTTL, so that a fleet started together does not call AWS in step.
	// Zero means DefaultCacheTTL (30s).
	CacheTTL time.Duration

	// MaxStale is how long past its lifetime an answer may still be served
	// when refreshing it fails; the failure is then logged at Warn level
	// instead of returned. Zero (the default) never serves a stale answer: a
	// failed refresh is returned to the caller. Either way a failed refresh
	// is not cached, so the next call tries again.
	MaxStale time.Duration

	// Config is the base configuration (credentials, HTTP client, logging)
	// of the clients NewASG builds. Nil (the default) means
	// config.LoadDefaultConfig, run on the first call to Peers or Group.
	Config *sdkaws.Config

	// IMDS, AutoScaling and EC2 are clients the caller owns, for example to
	// share them or to wrap them. Nil (the default) means a client built
	// from Config. A caller's IMDS client is used as given: it is the
	// caller's job to disable its IMDSv1 fallback (imds.Options
	// EnableFallback: sdkaws.FalseTernary), as the built one does. A caller's
	// AutoScaling and EC2 clients keep their own retry settings.
	IMDS        IMDSAPI
	AutoScaling ASGAPI
	EC2         EC2API

	// IMDSEndpoint, AutoScalingEndpoint and EC2Endpoint replace the
	// endpoints of the clients that NewASG builds, as absolute URLs such as
	// "http://127.0.0.1:1338" (a test server) or a VPC endpoint. Empty (the
	// default) means the SDK's resolution. Setting one together with the
	// matching client is an error.
	IMDSEndpoint        string
	AutoScalingEndpoint string
	EC2Endpoint         string

	// RetryMaxAttempts is how many times the built Auto Scaling and EC2
	// clients try one request, counting the first. They retry in the SDK's
	// adaptive mode, which also slows the client down while AWS throttles
	// it: after a throttling error a client may wait seconds before its next
	// attempt, and a Peers call lasts accordingly (bound it with its
	// context). Zero means DefaultRetryMaxAttempts (3).
	RetryMaxAttempts int

	// RetryMaxBackoff caps the delay between two attempts of the built Auto
	// Scaling and EC2 clients. Zero means DefaultRetryMaxBackoff (20s).
	RetryMaxBackoff time.Duration

	// Logger receives debug records of refreshes and warnings about stale
	// answers, in the group "discovery". Nil (the default) discards them.
	Logger *slog.Logger
}

func (o *ASGOptions) validate() error {
	var e OptionsError
	if !validPort(o.Port) {
		e.add(fmt.Sprintf("Port %d is out of range: want the peers' port, 1-65535", o.Port))
	}
	if o.CacheTTL < 0 {
		e.add(fmt.Sprintf("CacheTTL %s is negative: want 0 for the default (%s) or a positive duration", o.CacheTTL, DefaultCacheTTL))
	}
	if o.MaxStale < 0 {
		e.add(fmt.Sprintf("MaxStale %s is negative: want 0 to never serve a stale answer, or a positive duration", o.MaxStale))
	}
	if o.RetryMaxAttempts < 0 {
		e.add(fmt.Sprintf("RetryMaxAttempts %d is negative: want 0 for the default (%d) or a positive count", o.RetryMaxAttempts, DefaultRetryMaxAttempts))
	}
	if o.RetryMaxBackoff < 0 {
		e.add(fmt.Sprintf("RetryMaxBackoff %s is negative: want 0 for the default (%s) or a positive duration", o.RetryMaxBackoff, DefaultRetryMaxBackoff))
	}
	if len(o.GroupName) > 255 {
		e.add(fmt.Sprintf("GroupName is %d characters long: Auto Scaling group names have at most 255", len(o.GroupName)))
	}
	for _, ep := range []struct {
		field, url string
		client     bool
	}{
		{"IMDSEndpoint", o.IMDSEndpoint, o.IMDS != nil},
		{"AutoScalingEndpoint", o.AutoScalingEndpoint, o.AutoScaling != nil},
		{"EC2Endpoint", o.EC2Endpoint, o.EC2 != nil},
	} {
		if ep.url == "" {
			continue
		}
		if u, err := url.Parse(ep.url); err != nil || !u.IsAbs() || u.Host == "" {
			e.add(fmt.Sprintf("%s %q is not an absolute URL such as http://127.0.0.1:1338", ep.field, ep.url))
		}
		if ep.client {
			client := strings.TrimSuffix(ep.field, "Endpoint")
			e.add(fmt.Sprintf("%s is set but so is %s, a caller's client whose endpoint it would not change: set one of them", ep.field, client))
		}
	}
	return e.errOrNil()
}

// Instance is one instance of an Auto Scaling group, as one refresh saw it.
type Instance struct {
	// ID is the EC2 instance ID.
	ID string

	// LifecycleState is Auto Scaling's lifecycle state, such as "Pending",
	// "InService", "Standby", "Terminating" or "Terminated".
	LifecycleState string

	// HealthStatus is Auto Scaling's health status: "Healthy" or
	// "Unhealthy".
	HealthStatus string

	// PrivateIP is the instance's primary private IP address, as
	// DescribeInstances reported it. It is looked up only for instances that
	// are InService and Healthy, and is empty for the others and for those
	// that EC2 did not report as pending or running with an address.
	PrivateIP string

	// Addr is "PrivateIP:Port" when the instance is a peer, and empty
	// otherwise.
	Addr string
}

// Group is what one refresh learnt about an Auto Scaling group.
type Group struct {
	// Name is the group's name.
	Name string

	// Self is the ID of the instance this process runs on, read from
	// IMDSv2, or empty when NewASG did not need it: when GroupName is set
	// and so is Region (or both API clients are the caller's).
	Self string

	// Instances lists every instance the group reported, in any lifecycle
	// state, sorted by ID. An instance that has left the group, by
	// termination or detachment, is absent.
	Instances []Instance

	// FetchedAt is when the refresh that produced this Group ended, by the
	// local clock.
	FetchedAt time.Time
}

// Peers returns the addresses of the group's peers (InService, Healthy
// instances with a private IP), sorted by instance ID.
func (g Group) Peers() []string {
	addrs := []string{}
	for _, in := range g.Instances {
		if in.Addr != "" {
			addrs = append(addrs, in.Addr)
		}
	}
	return addrs
}

// Contains reports whether the instance with the given ID is in the group,
// in any lifecycle state. An instance that Contains no longer reports has
// been terminated or detached, unlike one that is merely Unhealthy or in
// Standby, which may come back.
func (g Group) Contains(id string) bool {
	_, found := slices.BinarySearchFunc(g.Instances, id, func(in Instance, id string) int {
		return strings.Compare(in.ID, id)
	})
	return found
}

func (g Group) clone() Group {
	g.Instances = slices.Clone(g.Instances)
	return g
}

// ASG is the Discoverer of the members of an Auto Scaling group. Its peers
// are the group's instances that are InService and Healthy, at their
// primary private IP address and ASGOptions.Port.
//
// The first call reads the instance's identity from IMDSv2 (unless
// GroupName and Region make it unnecessary) and, without GroupName, finds
// its group with DescribeAutoScalingInstances; both are kept for the ASG's
// life. Each refresh then calls DescribeAutoScalingGroups for the group and
// DescribeInstances for the InService and Healthy instances, at most
// DescribeInstancesBatch IDs per request and never with an empty list: an
// empty group yields an empty list without calling EC2. Answers are cached
// (see ASGOptions.CacheTTL and MaxStale); concurrent callers share one
// refresh.
//
// An ASG is safe for concurrent use. It never closes the clients it was
// given, and the ones it builds need no closing.
type ASG struct {
	opts ASGOptions
	log  *slog.Logger

	// Test hooks: the clock that dates answers, the draw in [0,1) that
	// sets each answer's lifetime within the jitter, and, if set, a call
	// made each time a caller starts waiting for another's refresh.
	now    func() time.Time
	rand   func() float64
	onWait func()

	mu      sync.Mutex
	cur     *Group    // the last answer, nil before the first success
	expires time.Time // end of cur's lifetime
	flight  *flight   // the refresh under way, if any

	// Set by the refresh in flight, read only by refreshes: one at a time.
	ready  bool
	self   string
	group  string
	asgAPI ASGAPI
	ec2API EC2API
}

// flight is one refresh that concurrent callers wait for.
type flight struct {
	done chan struct{}
	// Set before done is closed.
	g          Group
	err        error
	callerGone bool // the refreshing caller's context ended: err is not ours
}

// NewASG returns a Discoverer of the members of an Auto Scaling group. It
// validates opts, reporting every problem at once in an *OptionsError, and
// does no I/O: AWS is first contacted by Peers or Group.
func NewASG(opts ASGOptions) (*ASG, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.CacheTTL == 0 {
		opts.CacheTTL = DefaultCacheTTL
	}
	if opts.RetryMaxAttempts == 0 {
		opts.RetryMaxAttempts = DefaultRetryMaxAttempts
	}
	if opts.RetryMaxBackoff == 0 {
		opts.RetryMaxBackoff = DefaultRetryMaxBackoff
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &ASG{
		opts: opts,
		log:  log.WithGroup("discovery").With("source", schemeAWSASG),
		now:  time.Now,
		rand: rand.Float64,
	}, nil
}

// String returns "aws-asg", or "aws-asg:GROUP" when ASGOptions.GroupName is
// set.
func (a *ASG) String() string {
	if a.opts.GroupName != "" {
		return schemeAWSASG + ":" + a.opts.GroupName
	}
	return schemeAWSASG
}

// Peers returns the addresses of the group's InService, Healthy instances,
// sorted by instance ID; see Group.Peers.
func (a *ASG) Peers(ctx context.Context) ([]string, error) {
	g, err := a.get(ctx)
	if err != nil {
		return nil, err
	}
	return g.Peers(), nil
}

// Group returns the group's current state, from the cache when it is fresh.
// Unlike Peers it lists every instance, which lets a caller tell an
// instance that left the group (absent) from one that is only unhealthy.
func (a *ASG) Group(ctx context.Context) (Group, error) {
	g, err := a.get(ctx)
	if err != nil {
		return Group{}, err
	}
	return g.clone(), nil
}

// get returns the cached answer while it lives, or joins or starts a
// refresh. The returned Group is shared: callers must not modify it.
func (a *ASG) get(ctx context.Context) (Group, error) {
	for {
		a.mu.Lock()
		if a.cur != nil && a.now().Before(a.expires) {
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
			for _, in := range grp.Instances {
				id := sdkaws.ToString(in.InstanceId)
				if id == "" {
					continue
				}
				inst := Instance{ID: id, LifecycleState: string(in.LifecycleState), HealthStatus: sdkaws.ToString(in.HealthStatus)}
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
	slices.SortFunc(g.Instances, func(x, y Instance) int { return strings.Compare(x.ID, y.ID) })
	g.Instances = slices.CompactFunc(g.Instances, func(x, y Instance) bool { return x.ID == y.ID })

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
	for batch := range slices.Chunk(ids, DescribeInstancesBatch) {
		// A filter rather than InstanceIds: an instance that was terminated
		// and purged since DescribeAutoScalingGroups is then simply absent,
		// where InstanceIds would fail the whole request with
		// InvalidInstanceID.NotFound.
		pages := ec2.NewDescribeInstancesPaginator(a.ec2API, &ec2.DescribeInstancesInput{
			Filters:    []ec2types.Filter{{Name: sdkaws.String("instance-id"), Values: batch}},
			MaxResults: sdkaws.Int32(1000),
		})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				return nil, fmt.Errorf("discovery: DescribeInstances (%d instances of group %q): %w", len(batch), a.group, err)
			}
			for _, r := range page.Reservations {
				for _, in := range r.Instances {
					id, ip := sdkaws.ToString(in.InstanceId), sdkaws.ToString(in.PrivateIpAddress)
					if id == "" || ip == "" || !liveState(in.State) {
						continue
					}
					ips[id] = ip
				}
			}
		}
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
