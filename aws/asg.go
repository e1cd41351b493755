package aws

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

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

// GroupInstance is one instance of an Auto Scaling group, as one refresh
// saw it. (Instance is the process's own instance, watched for its
// lifecycle; see NewInstance.)
type GroupInstance struct {
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
	Instances []GroupInstance

	// DesiredCapacity is the group's desired capacity.
	DesiredCapacity int

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
	_, found := slices.BinarySearchFunc(g.Instances, id, func(in GroupInstance, id string) int {
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
	// placed maps the private IPs that refreshes saw to their instances,
	// kept a while after an instance leaves the group so that Departed
	// can still name it (departures.go).
	placed map[string]placedIP
	// unplacedSince is when Departed was first asked about each address
	// it could not place.
	unplacedSince map[string]time.Time

	// Set by the refresh in flight, read only by refreshes: one at a time.
	ready  bool
	self   string
	group  string
	asgAPI ASGAPI
	ec2API EC2API

	// launches caches the instances' launch times (BootstrapOrder).
	launches launchCache
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
