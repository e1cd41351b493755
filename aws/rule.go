package aws

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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

// Errors of LeaderByRule about the machine's AWS configuration. Retrying
// cannot help with them; the messages name the fix.
var (
	// ErrNoRegion reports that no AWS region was given (RuleOptions.Region,
	// AWS_REGION, the shared config) and none could be read from this
	// instance's identity document.
	ErrNoRegion = errors.New("aws: no AWS region: set AWS_REGION (or region in ~/.aws/config), or run on an EC2 instance whose metadata service answers IMDSv2")

	// ErrNoCredentials reports that the SDK's default chain found no
	// credentials: no AWS_ACCESS_KEY_ID, profile, web identity or instance
	// profile.
	ErrNoCredentials = errors.New("aws: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run on an EC2 instance with an instance profile")
)

// RuleOptions configures LeaderByRule. The zero value asks about this
// instance's own group, in this instance's region, with the SDK's default
// configuration.
type RuleOptions struct {
	// Group names the Auto Scaling group. Empty (the default) means the
	// group of this instance, found by reading its ID from IMDSv2 and
	// calling DescribeAutoScalingInstances.
	Group string

	// Self asks LeaderByRule to read this instance's ID from IMDSv2 even
	// when Group and Region make it unnecessary, and report it in
	// RuleLeader.Self: `is-leader` compares it with the winner.
	Self bool

	// Region is the group's AWS region. Empty (the default) means the
	// region of Config (AWS_REGION, the shared config file), else the one
	// in this instance's identity document.
	Region string

	// Config is the base configuration of the clients LeaderByRule builds.
	// Nil (the default) means config.LoadDefaultConfig.
	Config *sdkaws.Config

	// IMDS, AutoScaling and EC2 are clients the caller owns; nil (the
	// default) means clients built from Config. See ASGOptions.
	IMDS        IMDSAPI
	AutoScaling ASGAPI
	EC2         EC2API

	// IMDSEndpoint, AutoScalingEndpoint and EC2Endpoint replace the
	// endpoints of the built clients; empty (the default) means the SDK's
	// resolution, which also honours AWS_EC2_METADATA_SERVICE_ENDPOINT and
	// AWS_ENDPOINT_URL.
	IMDSEndpoint        string
	AutoScalingEndpoint string
	EC2Endpoint         string

	// RetryMaxAttempts and RetryMaxBackoff are as in ASGOptions; zero
	// means their defaults. Bound the whole call with ctx: a throttled
	// client may wait longer than a script wants.
	RetryMaxAttempts int
	RetryMaxBackoff  time.Duration

	// Logger receives debug records. Nil (the default) discards them.
	Logger *slog.Logger
}

// RuleLeader is the instance that the group's rule makes leader.
type RuleLeader struct {
	// InstanceID is the winner's EC2 instance ID.
	InstanceID string

	// PrivateIP is the winner's primary private IPv4 address, as
	// DescribeInstances reported it (empty if it reported none).
	PrivateIP string

	// Decided says how the winner was chosen, for people: the rule, how
	// many instances qualified, and any that were passed over.
	Decided string

	// Group is the Auto Scaling group asked.
	Group string

	// Self is this instance's ID, when it was read from IMDSv2 (always
	// with RuleOptions.Self or without RuleOptions.Group); empty otherwise.
	Self string
}

// LeaderByRule returns the leader of an Auto Scaling group by the rule of
// the sort-the-instance-IDs scripts, with their flaws fixed: the leader is
// the instance with the lowest instance ID (compared as strings, as sort(1)
// does) among those Auto Scaling reports InService and Healthy and EC2
// reports pending or running. It reads only the group: one
// DescribeAutoScalingGroups (and, without Group, one
// DescribeAutoScalingInstances for this instance), then DescribeInstances
// for the winner alone, and for the next in line only if EC2 reports the
// winner gone.
//
// ok is false, with a RuleLeader that has Group, Self and Decided set, when
// no instance qualifies. An error means the answer is unknown: never read
// it as "not the leader". Errors wrap ErrNoRegion, ErrNoCredentials,
// ErrIdentity, ErrNotInGroup or ErrGroupNotFound for configuration
// problems, and the SDK's error (throttling, 5xx, ctx's end) otherwise.
//
// The rule holds no lease and gives no fencing token: two instances that
// ask at different moments may each see itself first (Auto Scaling is
// eventually consistent, and the group changes). Use it where a script ran
// the rule before; use a lease (raft:// with --join aws-asg) for work that
// must never run twice at once.
func LeaderByRule(ctx context.Context, opts RuleOptions) (RuleLeader, bool, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.WithGroup("rule")
	c, err := ruleClients(ctx, &opts)
	if err != nil {
		return RuleLeader{}, false, err
	}
	res := RuleLeader{Group: c.group, Self: c.self}

	var all, eligible []string
	pages := autoscaling.NewDescribeAutoScalingGroupsPaginator(c.asg, &autoscaling.DescribeAutoScalingGroupsInput{
		AutoScalingGroupNames: []string{c.group},
	})
	found := false
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return res, false, fmt.Errorf("aws: DescribeAutoScalingGroups %q: %w", c.group, err)
		}
		for _, g := range page.AutoScalingGroups {
			if sdkaws.ToString(g.AutoScalingGroupName) != c.group {
				continue
			}
			found = true
			for _, in := range g.Instances {
				id := sdkaws.ToString(in.InstanceId)
				if id == "" {
					continue
				}
				all = append(all, id)
				if string(in.LifecycleState) == lifecycleInService && sdkaws.ToString(in.HealthStatus) == healthHealthy {
					eligible = append(eligible, id)
				}
			}
		}
	}
	if !found {
		return res, false, fmt.Errorf("%w: %q", ErrGroupNotFound, c.group)
	}
	slices.Sort(eligible)
	eligible = slices.Compact(eligible)
	slices.Sort(all)
	all = slices.Compact(all)

	var passed []string
	for _, id := range eligible {
		ip, live, err := describeOne(ctx, c.ec2, id)
		if err != nil {
			return res, false, fmt.Errorf("aws: DescribeInstances %s (group %q): %w", id, c.group, err)
		}
		if !live {
			passed = append(passed, id)
			continue
		}
		res.InstanceID, res.PrivateIP = id, ip
		break
	}
	res.Decided = fmt.Sprintf("lowest InService+Healthy instance id of %d (group %s has %d instances)", len(eligible), c.group, len(all))
	if len(passed) > 0 {
		res.Decided += fmt.Sprintf("; passed over %s: EC2 reports it neither pending nor running", strings.Join(passed, ", "))
	}
	log.Debug("decided", "group", c.group, "leader", res.InstanceID, "eligible", len(eligible), "instances", len(all), "passed_over", passed)
	if res.InstanceID == "" {
		res.Decided = fmt.Sprintf("no InService+Healthy instance in group %s (%d instances)", c.group, len(all))
		if len(passed) > 0 {
			res.Decided += fmt.Sprintf("; passed over %s: EC2 reports it neither pending nor running", strings.Join(passed, ", "))
		}
		return res, false, nil
	}
	return res, true, nil
}

// describeOne returns an instance's private IP and whether EC2 reports it
// pending or running. An instance EC2 no longer knows is not live.
func describeOne(ctx context.Context, client EC2API, id string) (ip string, live bool, err error) {
	// A filter rather than InstanceIds: an instance purged since
	// DescribeAutoScalingGroups is then absent, not an error.
	out, err := client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{
		Filters: []ec2types.Filter{{Name: sdkaws.String("instance-id"), Values: []string{id}}},
	})
	if err != nil {
		return "", false, err
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if sdkaws.ToString(in.InstanceId) == id && liveState(in.State) {
				return sdkaws.ToString(in.PrivateIpAddress), true, nil
			}
		}
	}
	return "", false, nil
}

// ruleAPI is what LeaderByRule talks to.
type ruleAPI struct {
	asg   ASGAPI
	ec2   EC2API
	group string
	self  string
}

// ruleClients resolves the configuration, the region, this instance's
// identity where needed, the clients and the group.
func ruleClients(ctx context.Context, o *RuleOptions) (ruleAPI, error) {
	build := o.AutoScaling == nil || o.EC2 == nil
	needIdentity := o.Group == "" || o.Self
	var cfg sdkaws.Config
	if build || (needIdentity && o.IMDS == nil) || o.Region == "" {
		if o.Config != nil {
			cfg = o.Config.Copy()
		} else {
			var err error
			if cfg, err = config.LoadDefaultConfig(ctx); err != nil {
				return ruleAPI{}, fmt.Errorf("aws: loading the AWS configuration (AWS_* variables, ~/.aws/config): %w", err)
			}
		}
	}
	region := o.Region
	if region == "" {
		region = cfg.Region
	}
	needIdentity = needIdentity || (build && region == "")

	// The credentials are checked while the identity is read: off EC2,
	// both end only after the SDK's retries of an absent metadata service.
	credsErr := make(chan error, 1)
	if build {
		go func() {
			if cfg.Credentials == nil {
				credsErr <- ErrNoCredentials
				return
			}
			if _, err := cfg.Credentials.Retrieve(ctx); err != nil && ctx.Err() == nil {
				credsErr <- fmt.Errorf("%w: %w", ErrNoCredentials, err)
				return
			}
			credsErr <- nil
		}()
	} else {
		credsErr <- nil
	}

	self := ""
	var identityErr error
	if needIdentity {
		client := o.IMDS
		if client == nil {
			client = imds.NewFromConfig(cfg, func(io *imds.Options) {
				io.EnableFallback = sdkaws.FalseTernary // IMDSv2 only
				if o.IMDSEndpoint != "" {
					io.Endpoint = o.IMDSEndpoint
				}
			})
		}
		doc, err := client.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{})
		switch {
		case err != nil:
			identityErr = fmt.Errorf("%w (there is no fallback to IMDSv1; in a container the instance's HttpPutResponseHopLimit must be at least 2): %w", ErrIdentity, err)
		case doc.InstanceID == "":
			identityErr = fmt.Errorf("%w: the identity document has no instance ID", ErrIdentity)
		default:
			self = doc.InstanceID
			if region == "" {
				region = doc.Region
			}
		}
	}
	var problems []error
	if build && region == "" {
		problems = append(problems, ErrNoRegion)
	}
	if err := <-credsErr; err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		if identityErr != nil && (o.Group == "" || o.Self) {
			problems = append(problems, identityErr)
		}
		return ruleAPI{}, errors.Join(problems...)
	}
	if identityErr != nil {
		return ruleAPI{}, identityErr
	}

	retryer := func() sdkaws.Retryer {
		return retry.NewAdaptiveMode(func(ao *retry.AdaptiveModeOptions) {
			ao.StandardOptions = append(ao.StandardOptions, func(so *retry.StandardOptions) {
				so.MaxAttempts = orDefault(o.RetryMaxAttempts, DefaultRetryMaxAttempts)
				so.MaxBackoff = orDefault(o.RetryMaxBackoff, DefaultRetryMaxBackoff)
			})
		})
	}
	c := ruleAPI{asg: o.AutoScaling, ec2: o.EC2, self: self, group: o.Group}
	if c.asg == nil {
		c.asg = autoscaling.NewFromConfig(cfg, func(ao *autoscaling.Options) {
			ao.Region = region
			ao.Retryer = retryer()
			ao.RetryMaxAttempts = 0
			if o.AutoScalingEndpoint != "" {
				ao.BaseEndpoint = sdkaws.String(o.AutoScalingEndpoint)
			}
		})
	}
	if c.ec2 == nil {
		c.ec2 = ec2.NewFromConfig(cfg, func(eo *ec2.Options) {
			eo.Region = region
			eo.Retryer = retryer()
			eo.RetryMaxAttempts = 0
			if o.EC2Endpoint != "" {
				eo.BaseEndpoint = sdkaws.String(o.EC2Endpoint)
			}
		})
	}
	if c.group == "" {
		g, err := ownGroup(ctx, c.asg, self)
		if err != nil {
			return ruleAPI{}, err
		}
		c.group = g
	}
	return c, nil
}

// orDefault returns v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
