package discovery

import (
	"errors"
	"strings"
)

// Sentinel errors. Errors returned by this package wrap one of them (or an
// error of the SDK or resolver underneath), so test them with errors.Is.
var (
	// ErrInvalidSpec is wrapped by Parse errors: an unknown scheme, or a spec
	// whose scheme is known but whose rest is malformed.
	ErrInvalidSpec = errors.New("discovery: invalid spec")

	// ErrInvalidAddress is wrapped by errors about an address that is not
	// "host:port" with a valid host and a port in 1-65535, or about a
	// malformed DNS name. (Failed lookups wrap the resolver's error.)
	ErrInvalidAddress = errors.New("discovery: invalid address")

	// ErrIdentity reports that the instance's identity (its ID and region)
	// could not be read from the instance metadata service with IMDSv2. It
	// wraps the SDK's error. AWSASG never falls back to IMDSv1, so a metadata
	// service that refuses session tokens yields this error.
	ErrIdentity = errors.New("discovery: cannot read this instance's identity with IMDSv2")

	// ErrNotInGroup reports that DescribeAutoScalingInstances does not list
	// this instance in any Auto Scaling group, and AWSOptions.GroupName was
	// not set.
	ErrNotInGroup = errors.New("discovery: this instance is not in an Auto Scaling group")

	// ErrGroupNotFound reports that DescribeAutoScalingGroups does not know
	// the group, for instance because it was deleted.
	ErrGroupNotFound = errors.New("discovery: Auto Scaling group not found")
)

// OptionsError lists every problem found in AWSOptions at once, so that a
// user fixes them in one go instead of one per run.
type OptionsError struct {
	// Problems are the individual findings, each naming the field, the bad
	// value and the fix.
	Problems []string
}

// Error implements error.
func (e *OptionsError) Error() string {
	return "discovery: invalid options: " + strings.Join(e.Problems, "; ")
}

// add records a problem; it keeps validation flat.
func (e *OptionsError) add(p string) { e.Problems = append(e.Problems, p) }

// errOrNil returns e as an error only when it holds problems, avoiding the
// typed-nil-in-interface trap.
func (e *OptionsError) errOrNil() error {
	if len(e.Problems) == 0 {
		return nil
	}
	return e
}
