package balance

import "errors"

// Sentinel errors; test them with errors.Is.
var (
	// ErrDuplicate is returned by Add for a lease name the Group already runs.
	ErrDuplicate = errors.New("balance: lease already added")

	// ErrUnknownLease is returned by Remove for a lease name the Group does not
	// run.
	ErrUnknownLease = errors.New("balance: no such lease")

	// ErrRunning is returned by Run when the Group is already running.
	ErrRunning = errors.New("balance: Group.Run is already running")

	// errStance cancels a campaign that the instance no longer wants to
	// make (its load rose, or the lease turned out to be free).
	errStance = errors.New("balance: campaign no longer wanted")

	// errShed cancels the callback of a lease the instance gives away.
	errShed = errors.New("balance: lease shed to a less loaded instance")

	// errRemoved cancels the callback of a lease removed with Remove.
	errRemoved = errors.New("balance: lease removed")

	// errTooShort is lead's error when baton.Lead resigned a term won with
	// no more than StopEarly left, without running anything.
	errTooShort = errors.New("balance: term won too close to its safe-until to lead")
)
