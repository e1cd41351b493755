package gocronbaton

import "errors"

// Sentinel errors; test them with errors.Is.
var (
	// ErrNotLeader is returned by Elector.IsLeader (and by a job wrapped with
	// Elector.Job) when this instance does not lead, or cannot tell that it
	// does. gocron then skips the run.
	ErrNotLeader = errors.New("gocronbaton: not the leader")

	// ErrLocked is returned by Locker.Lock when another instance holds the
	// job's lease, or another run of the job holds it in this instance, or
	// the lease could not be won within LockerOptions.Wait. gocron then skips
	// the run.
	ErrLocked = errors.New("gocronbaton: locked by another run")

	// ErrLockLost is returned by Lock.Unlock when the lock's term ended before
	// Unlock: the run went on without the lease for a while.
	ErrLockLost = errors.New("gocronbaton: lock lost before Unlock")

	// ErrNotLocked is returned by a job wrapped with Locker.Job that runs
	// without holding its lock: the scheduler does not use this Locker for
	// the job, or the job's name differs from the key given to Job.
	ErrNotLocked = errors.New("gocronbaton: job runs without its lock")
)
