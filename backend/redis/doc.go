// Package redis is a baton backend on Redis (go-redis v9): leases whose
// keys a redsync mutex of the same name shares, fencing tokens that rise
// across lost writes, and terms that stay safe through a Sentinel
// failover when acquisitions and renewals wait for a replica (Options.Replicas).
//
// # Guarantees
//
//   - One holder per lease at a time, on one Redis primary. A lease is a
//     key set with SET-if-absent and an expiry of a TTL (PX), as redsync
//     sets its mutexes; the holder's process extends it every
//     RenewInterval. A contender takes the lease only once the key is gone:
//     released, or expired on the server a TTL after its last renewal.
//   - A term's SafeUntil is the send time of the last confirmed renewal +
//     TTL − DriftMargin on the holder's monotonic clock (the key lives at
//     least a TTL from when the server received it); the term ends by
//     itself there, even when Redis cannot be reached. A reply never
//     stretches it. Safe while the holder's and the server's clock rates
//     differ by less than DriftMargin over a TTL, and while the server's
//     wall clock does not jump forward (Redis expires keys by it).
//   - Writes a failover loses: a Sentinel failover promotes a replica,
//     which lacks what the old primary had not yet sent it. With
//     Options.Replicas = N, an acquisition or a renewal counts only when N
//     replicas acknowledged it (WAIT, pipelined in the same round trip):
//     a term never rests on a write that only the old primary had, so the
//     promoted replica's copy of the key expires no earlier than the
//     holder's safe-until. With Replicas = 0 (the default, right for a
//     server without replicas) a failover can lose a renewal, the key then
//     expires early on the new primary, and two holders can act at once:
//     see docs/backends/redis.md.
//   - Fencing tokens strictly increase across the terms of a lease: every
//     acquisition increments the lease's token key, which is never deleted.
//     A token key created afresh starts at epoch<<32 + 1, the epoch being
//     the creator's wall-clock second or one above the highest this
//     process saw; a token key found below a token this process saw (the
//     store lost writes: a restart without persistence, an old snapshot, a
//     failover without WAIT) starts a new epoch too, and the process logs
//     it at Error level. Tokens are kept as Redis integers (int64): epochs
//     up to 2^31 − 1 (the year 2093).
//   - A store that lost every key (a restart without persistence, a
//     FLUSHALL) has lost its marker key too: the first candidate to find
//     it missing writes it with the server's time and its own TTL, and no
//     lease is granted until that TTL has passed on the server's clock, so
//     that holders of the lost leases (who renewed before the loss) have
//     stopped. Processes sharing a store should use one TTL: a holder
//     whose TTL is longer than the marker's could still act.
//   - Renewals cost one round trip per process per RenewInterval, however
//     many leases it holds: one script call extends all its keys.
//   - A release wakes one waiting process, not all of them. The
//     processes waiting for a lease queue in the store, first come first
//     (each read of the lease that finds it held joins the queue or keeps
//     the process's place); a release (Resign, Close) deletes the key and,
//     in the same script, publishes it on the process channel of the
//     queue's first process that is still subscribed and read its lease
//     within three PollIntervals, dropping those that are not (a killed
//     process's connection is closed: PUBLISH reaches nobody, and the next
//     is woken). The free lease is then the woken process's alone for a
//     tenth of the TTL (at most a second): a candidate that did not wait
//     in the queue, the resigner's own next one say, queues behind it
//     rather than taking the lease first. Each process subscribes on one
//     connection. A process that stops waiting leaves the queue and
//     passes on a wake-up it got.
//     Waiters also read their lease when its key is due to expire and
//     every PollInterval: a redsync release, an expiry and a wake-up lost
//     to a paused process publish nothing, and polling covers them.
//
// Not guaranteed: Redis Cluster (New refuses it: ErrCluster); a holder
// paused past its safe-until may still write elsewhere, which only a
// fence on the token stops; Leader names a dead holder until its key
// expires.
//
// # Keys
//
// Under Options.Prefix (default "baton:"), lease NAME uses:
//
//	baton:lease:NAME   the holder while held: "baton TOKEN TTL_MS SINCE_MS HOLDER",
//	                   expiring a TTL after the last renewal (a redsync mutex
//	                   named "baton:lease:NAME" sets its random value here)
//	baton:token:NAME   the last fencing token, never deleted
//	baton:state:NAME   the lease's state (baton.StateTerm)
//	baton:store        the store's marker: "SERVER_TIME_MS TTL_MS", no expiry
//	baton:queue:NAME   the processes waiting for the lease (a sorted set of
//	                   Backend IDs, by when each joined)
//	baton:waiting:NAME when each queued process's entry lapses (server ms)
//	baton:woken:NAME   the Backend ID of the process a release just woke, for
//	                   a tenth of the TTL (at most a second)
//	baton:released     the channel: each release or acquisition publishes the
//	                   lease key (for WatchLeader)
//	baton:wake:ID      a process's channel: a release publishes the lease key
//	                   to the first live process in the lease's queue
//
// # Use
//
// The caller owns the client and closes it after the Backend (ParseURL
// reads redis://, rediss:// and redis+sentinel:// URLs):
//
//	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: addrs})
//	b, err := baton_redis.New(ctx, client, baton_redis.Options{Replicas: 1})
//	defer b.Close(ctx)
package redis
