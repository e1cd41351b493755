package aws

import (
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
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
