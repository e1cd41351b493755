// Package gocronbaton plugs baton into gocron v2 (github.com/go-co-op/gocron/v2):
// an Elector for gocron.WithDistributedElector and a Locker for
// gocron.WithDistributedLocker and gocron.WithDistributedJobLocker, so that
// a gocron scheduler running in every instance of a service runs each job in
// one instance only, with baton's leases underneath.
//
// # What is guaranteed, and what is not
//
// gocron asks its Elector or Locker once, just before a run starts, and then
// runs the job function with a context of its own (the job's context, which
// gocron cancels only when the job is removed or the scheduler shuts down).
// Neither interface can stop a run that is already going. So:
//
//   - A run starts only while this instance holds a live baton term: the
//     Elector's IsLeader returns nil only for the holder of its lease, before
//     the term's safe-until deadline (less ElectorOptions.MinRemaining), and
//     the Locker's Lock succeeds only with a term of the job's lease.
//   - A plain job function keeps running when the term ends under it (the
//     lease was lost, or expired at safe-until because the backend could not
//     be reached), and another instance may then start the job. gocron gives
//     no way to prevent that. Wrap the function with Elector.Job or
//     Locker.Job to get a context that ends when the term ends, and the Term
//     itself (also through TermFromContext): stop at ctx.Done() and send
//     Term.Token() with every write downstream, so the store can reject a
//     stale writer. Only fencing closes the gap for a run that does not stop
//     in time (see package baton).
//   - Elector: a graceful hand-over (Run's context cancelled) waits for runs
//     wrapped with Elector.Job to return before the lease is released, so
//     such runs never overlap across a hand-over. Runs not wrapped are not
//     waited for.
//   - Locker: the lock is held for at least LockerOptions.Hold after Lock
//     acquired it, even if the job finished sooner, so that the other
//     schedulers' attempts at the same run, which fire up to a clock
//     difference later, find it taken. gocron's own caveat stands: schedulers
//     fire at their own times, so runs line up across instances only when
//     the job's start is aligned (gocron.WithStartAt) or its schedule is a
//     wall-clock one (cron, daily). Unlock releases the lease, after the rest
//     of Hold; an Unlock after the term ended returns an error wrapping
//     ErrLockLost, which gocron ignores, so the Locker also logs it.
//
// # gocronbaton or package schedule
//
// baton has one cron engine: package schedule (what `baton cron` runs),
// which runs each slot at most once across the group, even across a
// failover, by keeping the last slot in the lease (baton.StateTerm). This
// package has no engine: gocron schedules, and gocronbaton only answers
// gocron's "may I run?" with baton's leases, on the same term step as
// everything else (baton.Campaign and baton.Lead). Use it when a program
// already runs its jobs on gocron; for new leader-only cron jobs, use
// package schedule.
//
// # Elector or Locker
//
// The Elector makes one instance run every job (a leader), and fails over
// when it dies. The Locker lets any instance run any run, one at a time, so
// runs spread over the instances; each Lock costs a Leader request and, when
// the lease is free, a campaign. To spread many jobs' leadership evenly
// instead, see package balance.
package gocronbaton
