package aws

import (
	"errors"
	"strings"
)

// Sentinel errors. Errors returned by this package wrap one of them (or an
// error of the SDK underneath), so test them with errors.Is; errors about a
// spec wrap discovery.ErrInvalidSpec too.
var (
	// ErrIdentity reports that the instance's identity (its ID and region)
	// could not be read from the instance metadata service with IMDSv2. It
	// wraps the SDK's error. NewASG never falls back to IMDSv1, so a metadata
	// service that refuses session tokens yields this error.
	ErrIdentity = errors.New("discovery: cannot read this instance's identity with IMDSv2")

	// ErrNotInGroup reports that DescribeAutoScalingInstances does not list
	// this instance in any Auto Scaling group, and ASGOptions.GroupName was
	// not set.
	ErrNotInGroup = errors.New("discovery: this instance is not in an Auto Scaling group")

	// ErrGroupNotFound reports that DescribeAutoScalingGroups does not know
	// the group, for instance because it was deleted.
	ErrGroupNotFound = errors.New("discovery: Auto Scaling group not found")
)

// OptionsError lists every problem found in ASGOptions at once, so that a
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
