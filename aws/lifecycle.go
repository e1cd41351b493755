package aws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// InstanceIMDSAPI is the part of the instance metadata client that
// NewInstance uses. *imds.Client implements it.
type InstanceIMDSAPI interface {
	IMDSAPI
	GetMetadata(ctx context.Context, in *imds.GetMetadataInput, optFns ...func(*imds.Options)) (*imds.GetMetadataOutput, error)
}

// LifecycleAPI is the part of the Auto Scaling client that an Instance
// uses: its own lifecycle state, and its lifecycle hook.
// *autoscaling.Client implements it.
type LifecycleAPI interface {
	DescribeAutoScalingInstances(ctx context.Context, in *autoscaling.DescribeAutoScalingInstancesInput, optFns ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingInstancesOutput, error)
	DescribeLifecycleHooks(ctx context.Context, in *autoscaling.DescribeLifecycleHooksInput, optFns ...func(*autoscaling.Options)) (*autoscaling.DescribeLifecycleHooksOutput, error)
	CompleteLifecycleAction(ctx context.Context, in *autoscaling.CompleteLifecycleActionInput, optFns ...func(*autoscaling.Options)) (*autoscaling.CompleteLifecycleActionOutput, error)
	RecordLifecycleActionHeartbeat(ctx context.Context, in *autoscaling.RecordLifecycleActionHeartbeatInput, optFns ...func(*autoscaling.Options)) (*autoscaling.RecordLifecycleActionHeartbeatOutput, error)
}

var (
	_ InstanceIMDSAPI = (*imds.Client)(nil)
	_ LifecycleAPI    = (*autoscaling.Client)(nil)
)

// The reasons LeaveReason gives.
const (
	// ReasonTerminating: Auto Scaling is terminating the instance (its
	// target lifecycle state in IMDS is Terminated): scale-in, a health
	// replacement, an instance refresh, an AZ rebalance.
	ReasonTerminating = "instance terminating"

	// ReasonSpot: EC2 sent a spot interruption notice
	// (spot/instance-action); the instance is stopped, hibernated or
	// terminated about two minutes later.
	ReasonSpot = "spot interruption"

	// ReasonRebalance: EC2 recommends rebalancing the spot instance
	// (events/recommendations/rebalance), which comes before an
	// interruption notice, if one comes at all. Acted on only with
	// InstanceOptions.Rebalance.
	ReasonRebalance = "rebalance recommendation"
)

// Defaults of InstanceOptions, applied when a field is zero.
const (
	// DefaultIMDSInterval is the default InstanceOptions.Interval. The
	// instance metadata service is local to the instance and counts against
	// no API limit (only its own per-instance packet rate, far above the
	// three requests per interval made here), so it is polled often: a
	// notice is seen within a second, a small part of a spot notice's two
	// minutes and of a lifecycle hook's shortest timeout (30s).
	DefaultIMDSInterval = time.Second

	// DefaultStateInterval is the default InstanceOptions.StateInterval:
	// how often an InService instance asks Auto Scaling for its own
	// lifecycle state. Leaving service shows in IMDS within Interval (the
	// target lifecycle state turns Standby, Detached or Terminated), so
	// this call is a safety net and is kept rare: 100 instances make 1.7
	// DescribeAutoScalingInstances calls a second between them.
	DefaultStateInterval = time.Minute

	// DefaultHeartbeatInterval is the interval between two
	// RecordLifecycleActionHeartbeat calls when the hook's heartbeat
	// timeout could not be read (DescribeLifecycleHooks was denied): a
	// third of the shortest timeout Auto Scaling allows (30s), so that it
	// keeps any hook alive.
	DefaultHeartbeatInterval = 10 * time.Second
)

// enteringDivisor divides StateInterval while the instance is on its way
// into service (Pending, or its target lifecycle state InService while its
// own state is not yet): one minute would delay its first campaign by that
// much, and instances launch a few at a time, so the faster rate costs
// little.
const enteringDivisor = 6

// maxStateBackoff caps the wait between two DescribeAutoScalingInstances
// calls after failures (throttling, most often).
const maxStateBackoff = 5 * time.Minute

// imdsTimeout bounds one read of the instance metadata service.
const imdsTimeout = 2 * time.Second

// The instance metadata paths an Instance polls, under /latest/meta-data.
const (
	pathTargetState = "autoscaling/target-lifecycle-state"
	pathSpotAction  = "spot/instance-action"
	pathRebalance   = "events/recommendations/rebalance"
)

// Auto Scaling's target lifecycle state of an instance being terminated.
const targetTerminated = "Terminated"

// InstanceOptions configures NewInstance. The zero value is valid: it
// watches this instance with clients built from the default AWS
// configuration, without a lifecycle hook.
type InstanceOptions struct {
	// IMDS is the instance metadata client, which the caller owns. Nil (the
	// default) means one built from Config with IMDSv2 only (no fallback to
	// IMDSv1). A caller's client is used as given: it is the caller's job
	// to disable its IMDSv1 fallback (imds.Options EnableFallback:
	// sdkaws.FalseTernary).
	IMDS InstanceIMDSAPI

	// ASG is the Auto Scaling client, which the caller owns: for
	// DescribeAutoScalingInstances (this instance's group and lifecycle
	// state), DescribeLifecycleHooks, CompleteLifecycleAction and
	// RecordLifecycleActionHeartbeat. Nil (the default) means one built from
	// Config, in Region, retrying throttling in the SDK's adaptive mode.
	ASG LifecycleAPI

	// Hook names the group's termination lifecycle hook
	// (autoscaling:EC2_INSTANCE_TERMINATING) that Complete and Heartbeat act
	// on. Empty (the default) means none: they do nothing.
	Hook string

	// Rebalance makes a rebalance recommendation close Leaving, as a spot
	// interruption notice does. False (the default) ignores it: a
	// recommendation is often followed by nothing.
	Rebalance bool

	// Interval is how often Run reads the target lifecycle state, the spot
	// interruption notice and (with Rebalance) the rebalance
	// recommendation from IMDS. Zero means DefaultIMDSInterval (1s).
	Interval time.Duration

	// StateInterval is how often Run asks Auto Scaling for this instance's
	// own lifecycle state while it is InService, each wait drawn within
	// ±20% so that a fleet does not call in step. While the instance is on
	// its way into service it asks six times as often; after failures it
	// backs off, doubling the wait up to five minutes. Zero means
	// DefaultStateInterval (1m).
	StateInterval time.Duration

	// HeartbeatInterval is the interval between two
	// RecordLifecycleActionHeartbeat calls while Heartbeat runs. Zero (the
	// default) means a third of the hook's heartbeat timeout, read with
	// DescribeLifecycleHooks, so that two calls may fail before the hook
	// times out; or DefaultHeartbeatInterval if that call is denied.
	HeartbeatInterval time.Duration

	// Region is the AWS region of the built Auto Scaling client. Empty (the
	// default) means the region in this instance's identity document.
	Region string

	// Config is the base configuration (credentials, HTTP client) of the
	// clients NewInstance builds. Nil (the default) means
	// config.LoadDefaultConfig.
	Config *sdkaws.Config

	// IMDSEndpoint and AutoScalingEndpoint replace the endpoints of the
	// clients that NewInstance builds, as absolute URLs. Empty (the default)
	// means the SDK's resolution. Setting one together with the matching
	// client is an error.
	IMDSEndpoint        string
	AutoScalingEndpoint string

	// Logger receives the notices, the changes of InService, lifecycle
	// actions and failures, in the group "lifecycle". Nil (the default)
	// discards them.
	Logger *slog.Logger
}

// hookNameRE is Auto Scaling's pattern for a lifecycle hook name.
var hookNameRE = regexp.MustCompile(`^[A-Za-z0-9\-_/]{1,255}$`)

func (o *InstanceOptions) validate() error {
	var e OptionsError
	for _, d := range []struct {
		field string
		v     time.Duration
		def   time.Duration
	}{
		{"Interval", o.Interval, DefaultIMDSInterval},
		{"StateInterval", o.StateInterval, DefaultStateInterval},
		{"HeartbeatInterval", o.HeartbeatInterval, 0},
	} {
		if d.v < 0 {
			def := "the default"
			if d.def > 0 {
				def += " (" + d.def.String() + ")"
			}
			e.add(fmt.Sprintf("%s %s is negative: want 0 for %s or a positive duration", d.field, d.v, def))
		}
	}
	if o.Hook != "" && !hookNameRE.MatchString(o.Hook) {
		e.add(fmt.Sprintf("Hook %q is not a lifecycle hook name: want 1-255 letters, digits, '-', '_' or '/'", o.Hook))
	}
	for _, ep := range []struct {
		field, url string
		client     bool
		name       string
	}{
		{"IMDSEndpoint", o.IMDSEndpoint, o.IMDS != nil, "IMDS"},
		{"AutoScalingEndpoint", o.AutoScalingEndpoint, o.ASG != nil, "ASG"},
	} {
		if ep.url == "" {
			continue
		}
		if u, err := url.Parse(ep.url); err != nil || !u.IsAbs() || u.Host == "" {
			e.add(fmt.Sprintf("%s %q is not an absolute URL such as http://127.0.0.1:1338", ep.field, ep.url))
		}
		if ep.client {
			e.add(fmt.Sprintf("%s is set but so is %s, a caller's client whose endpoint it would not change: set one of them", ep.field, ep.name))
		}
	}
	return e.errOrNil()
}

// Instance watches the EC2 instance this process runs on for the notices
// that it is about to leave its Auto Scaling group, and tracks whether it
// is in service; with a lifecycle hook it also tells Auto Scaling when a
// hand-over is under way (Heartbeat) and when it is done (Complete).
//
// What it guarantees, and what it cannot:
//   - Leaving closes at most Interval (plus one IMDS read) after IMDS shows
//     the target lifecycle state Terminated, a spot interruption notice or,
//     with Rebalance, a rebalance recommendation, while Run runs. It
//     closes once and stays closed; the first notice names the reason.
//   - InService is false as soon as Leaving closes or the target
//     lifecycle state is anything but InService (Standby, Detached,
//     Terminated, a warm pool's), within Interval. It turns true only after
//     Auto Scaling itself reports the instance InService
//     (DescribeAutoScalingInstances), which may lag by StateInterval.
//   - Notices are what EC2 publishes and no more: an instance stopped or
//     lost without one (a hardware failure, a forced termination) gives
//     none, and EC2 may terminate a spot instance before its notice's
//     time. Hand-over on a notice shortens a failover; it never replaces
//     the lease's own safety.
//   - Instance reads IMDS with IMDSv2 only when it builds the client: a
//     metadata service that refuses session tokens fails NewInstance with
//     ErrIdentity.
//
// A program hands over so:
//
//	inst, err := aws.NewInstance(ctx, aws.InstanceOptions{Hook: "drain"})
//	go inst.Run(ctx)
//	<-inst.Leaving()                  // or a signal, or the work's end
//	stop := inst.Heartbeat(ctx)
//	// ... stop the work, resign the leases ...
//	stop()
//	err = inst.Complete(ctx)          // the group terminates the instance
//
// An Instance is safe for concurrent use. It never closes the clients it
// was given, and the ones it builds need no closing.
type Instance struct {
	opts      InstanceOptions
	log       *slog.Logger
	imds      InstanceIMDSAPI
	asg       LifecycleAPI
	id, group string
	heartbeat time.Duration // between two heartbeats

	// Test hooks: the draw in [0,1) that sets each wait within the jitter,
	// and the first wait after a failed lifecycle action call.
	rand      func() float64
	retryBase time.Duration

	running    atomic.Bool
	completeMu sync.Mutex // serialises Complete

	mu        sync.Mutex
	own       string // own lifecycle state per Auto Scaling; "" once the group no longer lists it
	target    string // target lifecycle state per IMDS; "" where IMDS has none
	inService bool
	changed   chan struct{} // closed at the next change of inService
	leaving   chan struct{}
	reason    string
	completed bool      // CompleteLifecycleAction succeeded
	polls     int       // IMDS rounds done
	warned    time.Time // last IMDS failure logged
}

// NewInstance reads this instance's identity with IMDSv2, finds its Auto
// Scaling group and lifecycle state with DescribeAutoScalingInstances, and,
// with a Hook, checks that the group has that termination hook and reads
// its heartbeat timeout (DescribeLifecycleHooks). It reads IMDS's notices
// once, so that Leaving and InService are meaningful before Run starts.
//
// Errors: an *OptionsError listing every problem of opts; ErrIdentity when
// IMDSv2 gives no identity; ErrNotInGroup when Auto Scaling does not list
// the instance; ErrLifecycleHook when the hook is missing or not a
// termination hook; or the AWS error, wrapped.
func NewInstance(ctx context.Context, opts InstanceOptions) (*Instance, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultIMDSInterval
	}
	if opts.StateInterval == 0 {
		opts.StateInterval = DefaultStateInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	i := &Instance{
		opts:      opts,
		log:       log.WithGroup("lifecycle"),
		imds:      opts.IMDS,
		asg:       opts.ASG,
		rand:      rand.Float64,
		retryBase: time.Second,
		changed:   make(chan struct{}),
		leaving:   make(chan struct{}),
	}

	var cfg sdkaws.Config
	if i.imds == nil || i.asg == nil {
		if opts.Config != nil {
			cfg = opts.Config.Copy()
		} else {
			var err error
			if cfg, err = config.LoadDefaultConfig(ctx); err != nil {
				return nil, fmt.Errorf("aws lifecycle: loading the AWS configuration: %w", err)
			}
		}
	}
	if i.imds == nil {
		i.imds = imds.NewFromConfig(cfg, func(io *imds.Options) {
			// Fail closed: never the unauthenticated IMDSv1.
			io.EnableFallback = sdkaws.FalseTernary
			if opts.IMDSEndpoint != "" {
				io.Endpoint = opts.IMDSEndpoint
			}
		})
	}
	doc, err := i.imds.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{})
	if err != nil {
		return nil, fmt.Errorf("%w (there is no fallback to IMDSv1; in a container the instance's HttpPutResponseHopLimit must be at least 2): %w", ErrIdentity, err)
	}
	if doc.InstanceID == "" {
		return nil, fmt.Errorf("%w: the identity document has no instance ID", ErrIdentity)
	}
	i.id = doc.InstanceID
	if i.asg == nil {
		region := opts.Region
		if region == "" {
			region = doc.Region
		}
		if region == "" {
			return nil, fmt.Errorf("%w: the identity document names no region; set InstanceOptions.Region", ErrIdentity)
		}
		i.asg = autoscaling.NewFromConfig(cfg, func(ao *autoscaling.Options) {
			ao.Region = region
			ao.Retryer = adaptiveRetryer(DefaultRetryMaxAttempts, DefaultRetryMaxBackoff)
			ao.RetryMaxAttempts = 0 // the retryer counts them
			if opts.AutoScalingEndpoint != "" {
				ao.BaseEndpoint = sdkaws.String(opts.AutoScalingEndpoint)
			}
		})
	}

	own, group, err := i.describeSelf(ctx)
	if err != nil {
		return nil, err
	}
	if group == "" {
		return nil, fmt.Errorf("%w: instance %s", ErrNotInGroup, i.id)
	}
	i.group, i.own = group, own

	if opts.Hook != "" {
		if err := i.readHook(ctx); err != nil {
			return nil, err
		}
	}
	i.pollIMDS(ctx)
	i.mu.Lock()
	i.inService = i.inServiceLocked()
	i.mu.Unlock()
	i.log.Info("watching the instance", "instance", i.id, "group", i.group,
		"state", own, "in_service", i.InService(), "hook", opts.Hook, "rebalance", opts.Rebalance)
	return i, nil
}

// ID returns the EC2 instance ID, read from IMDSv2.
func (i *Instance) ID() string { return i.id }

// Group returns the name of the instance's Auto Scaling group.
func (i *Instance) Group() string { return i.group }

// Leaving returns a channel that is closed when the instance is about to
// leave: its target lifecycle state turned Terminated, EC2 sent a spot
// interruption notice or, with InstanceOptions.Rebalance, a rebalance
// recommendation. It is closed at most once and never reopened.
func (i *Instance) Leaving() <-chan struct{} { return i.leaving }

// LeaveReason returns why Leaving closed: ReasonTerminating, ReasonSpot or
// ReasonRebalance; or "" while it is open.
func (i *Instance) LeaveReason() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.reason
}

// InService reports whether the instance may serve: Auto Scaling last
// reported its lifecycle state InService, its target lifecycle state in
// IMDS (where IMDS has one) is InService too, and Leaving is open.
func (i *Instance) InService() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.inService
}

// InServiceChanged returns a channel closed at the next change of
// InService. Call it before InService, so that a change between the two
// calls is not missed, and again after each change.
func (i *Instance) InServiceChanged() <-chan struct{} {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.changed
}

// Run polls IMDS every Interval and Auto Scaling every StateInterval (see
// InstanceOptions) until ctx ends, and then returns nil. Failures are
// logged and retried, never returned: the last state read stands
// meanwhile. It returns an error at once if another Run is running.
func (i *Instance) Run(ctx context.Context) error {
	if !i.running.CompareAndSwap(false, true) {
		return errors.New("aws lifecycle: Run called while another Run is running")
	}
	defer i.running.Store(false)

	imdsTick := time.NewTicker(i.opts.Interval)
	defer imdsTick.Stop()
	failures := 0
	stateDue := time.Now().Add(i.stateDelay(failures))
	stateTimer := time.NewTimer(time.Until(stateDue))
	defer stateTimer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-imdsTick.C:
			i.pollIMDS(ctx)
			// A target that turned InService while Auto Scaling's state
			// is not yet: ask sooner than the InService pace.
			if failures == 0 && i.entering() {
				fast := time.Duration(float64(i.opts.StateInterval/enteringDivisor) * (1 + cacheJitter))
				if time.Until(stateDue) > fast {
					d := i.stateDelay(0)
					stateDue = time.Now().Add(d)
					stateTimer.Reset(d)
				}
			}
		case <-stateTimer.C:
			if err := i.pollState(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				failures++
				i.log.Warn("cannot read the instance's lifecycle state; keeping the last one", "state", i.ownState(), "failures", failures, "err", err)
			} else {
				failures = 0
			}
			d := i.stateDelay(failures)
			stateDue = time.Now().Add(d)
			stateTimer.Reset(d)
		}
	}
}

// stateDelay is the wait before the next DescribeAutoScalingInstances:
// StateInterval, or a sixth of it while the instance is entering service,
// doubled for each failure in a row up to maxStateBackoff, within ±20%.
func (i *Instance) stateDelay(failures int) time.Duration {
	d := i.opts.StateInterval
	i.mu.Lock()
	if i.enteringLocked() {
		d /= enteringDivisor
	}
	i.mu.Unlock()
	for range failures {
		d *= 2
		if d >= maxStateBackoff {
			d = maxStateBackoff
			break
		}
	}
	return time.Duration(float64(d) * (1 - cacheJitter + 2*cacheJitter*i.rand()))
}

func (i *Instance) entering() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.enteringLocked()
}

// enteringLocked reports whether the instance is on its way into service.
func (i *Instance) enteringLocked() bool {
	if i.own == lifecycleInService || i.reason != "" {
		return false
	}
	return strings.HasPrefix(i.own, "Pending") || i.target == lifecycleInService
}

func (i *Instance) ownState() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.own
}

// describeSelf returns the instance's lifecycle state and group, both ""
// when Auto Scaling does not list it.
func (i *Instance) describeSelf(ctx context.Context) (state, group string, err error) {
	out, err := i.asg.DescribeAutoScalingInstances(ctx, &autoscaling.DescribeAutoScalingInstancesInput{
		InstanceIds: []string{i.id},
	})
	if err != nil {
		return "", "", fmt.Errorf("aws lifecycle: DescribeAutoScalingInstances %s: %w", i.id, err)
	}
	for _, in := range out.AutoScalingInstances {
		if sdkaws.ToString(in.InstanceId) == i.id {
			return sdkaws.ToString(in.LifecycleState), sdkaws.ToString(in.AutoScalingGroupName), nil
		}
	}
	return "", "", nil
}

// pollState reads the instance's own lifecycle state from Auto Scaling.
func (i *Instance) pollState(ctx context.Context) error {
	state, group, err := i.describeSelf(ctx)
	if err != nil {
		return err
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if state != i.own {
		i.log.Info("lifecycle state changed", "from", i.own, "to", state, "group", group)
		i.own = state
	}
	i.updateLocked()
	return nil
}

// pollIMDS reads the target lifecycle state and, until Leaving closes, the
// notices. A failed read leaves the last value in place.
func (i *Instance) pollIMDS(ctx context.Context) {
	target, found, err := i.readIMDS(ctx, pathTargetState)
	if err == nil && !found {
		target = "" // not in a group, or IMDS without the path
	}
	var leave, detail string
	if err == nil && target == targetTerminated {
		leave = ReasonTerminating
	}
	if err == nil && leave == "" && !i.isLeaving() {
		var body string
		body, found, err = i.readIMDS(ctx, pathSpotAction)
		if err == nil && found {
			leave, detail = ReasonSpot, spotDetail(body)
		}
		if err == nil && leave == "" && i.opts.Rebalance {
			body, found, err = i.readIMDS(ctx, pathRebalance)
			if err == nil && found {
				leave, detail = ReasonRebalance, strings.TrimSpace(body)
			}
		}
	}

	i.mu.Lock()
	defer i.mu.Unlock()
	i.polls++
	if err != nil {
		if ctx.Err() == nil && time.Since(i.warned) >= time.Minute {
			i.warned = time.Now()
			i.log.Warn("cannot read the instance metadata; keeping the last state (logged at most once a minute)", "err", err)
		}
		return
	}
	if target != i.target {
		i.log.Info("target lifecycle state changed", "from", i.target, "to", target)
		i.target = target
	}
	if leave != "" && i.reason == "" {
		i.reason = leave
		close(i.leaving)
		i.log.Warn("the instance is leaving: hand over now", "reason", leave, "notice", detail, "instance", i.id, "group", i.group)
	}
	i.updateLocked()
}

func (i *Instance) isLeaving() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.reason != ""
}

// readIMDS reads a metadata path; found is false when IMDS answers 404,
// which is how it says there is no notice.
func (i *Instance) readIMDS(ctx context.Context, path string) (body string, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, imdsTimeout)
	defer cancel()
	out, err := i.imds.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
			return "", false, nil
		}
		return "", false, fmt.Errorf("aws lifecycle: reading %s from IMDS: %w", path, err)
	}
	defer out.Content.Close()
	b, err := io.ReadAll(io.LimitReader(out.Content, 64<<10))
	if err != nil {
		return "", false, fmt.Errorf("aws lifecycle: reading %s from IMDS: %w", path, err)
	}
	return strings.TrimSpace(string(b)), true, nil
}

// spotDetail summarises a spot instance-action document for the log.
func spotDetail(body string) string {
	var n struct {
		Action string `json:"action"`
		Time   string `json:"time"`
	}
	if json.Unmarshal([]byte(body), &n) != nil || n.Action == "" {
		return body
	}
	return n.Action + " at " + n.Time
}

// inServiceLocked computes InService from the state.
func (i *Instance) inServiceLocked() bool {
	return i.own == lifecycleInService &&
		(i.target == "" || i.target == lifecycleInService) &&
		i.reason == ""
}

// updateLocked recomputes InService and wakes the waiters on a change.
func (i *Instance) updateLocked() {
	now := i.inServiceLocked()
	if now == i.inService {
		return
	}
	i.inService = now
	close(i.changed)
	i.changed = make(chan struct{})
	i.log.Info("in service changed", "in_service", now, "state", i.own, "target", i.target, "leaving", i.reason)
}

// pollCount is how many IMDS rounds have been done, for tests.
func (i *Instance) pollCount() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.polls
}
