package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	goredis "github.com/redis/go-redis/v9"
)

// Backend runs baton leases in a Redis database. One Backend stands for
// one process: it renews every lease key it holds in one script call per
// RenewInterval, and listens for releases on one pub/sub connection. It is
// safe for concurrent use; it allows one campaign per lease name at a
// time, whatever the candidate.
type Backend struct {
	c        goredis.UniversalClient
	o        options
	sessions *backend.SessionManager[string]
	epochs   backend.EpochTracker
	listen   *listener
	// id names this Backend in the leases' queues and its process
	// channel (WakeChannel).
	id string

	mu       sync.Mutex
	held     map[string]*term // lease name -> the live term's key and value
	inflight map[*int]time.Time
	seen     map[string]uint64 // the highest token seen per lease
}

var (
	_ baton.Backend           = (*Backend)(nil)
	_ baton.StateTerm         = (*term)(nil)
	_ baton.ResignRequestTerm = (*term)(nil)
)

// ErrCluster is wrapped by New's error for a Redis Cluster: its lease,
// token and state keys would hash to different slots, and a renewal of
// many leases is one script over many keys. Use a single primary (with
// Sentinel for failover).
var ErrCluster = errors.New("redis: Redis Cluster is not supported: baton's scripts touch several keys in one call (a lease's key and its token key; every lease of a process in one renewal), which a cluster refuses across hash slots; use a single primary, with replicas and Sentinel for failover")

// New returns a Backend on client, which the caller owns and closes after
// Close. A *goredis.ClusterClient, or a server with cluster mode on, is
// refused (ErrCluster, in a *baton.ConfigError). Bad options give a
// *baton.ConfigError naming every problem. ctx bounds the check of the
// server.
func New(ctx context.Context, client goredis.UniversalClient, opts Options) (*Backend, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if client == nil {
		return nil, &baton.ConfigError{Problems: []string{"redis: the client is nil: pass a *redis.Client from redis.NewClient or redis.NewFailoverClient"}}
	}
	if _, ok := client.(*goredis.ClusterClient); ok {
		return nil, &baton.ConfigError{Problems: []string{ErrCluster.Error()}}
	}
	info, err := client.Info(ctx, "cluster").Result()
	if err != nil {
		return nil, fmt.Errorf("%w: redis: check the server: %w", baton.ErrBackendUnavailable, err)
	}
	if strings.Contains(info, "cluster_enabled:1") {
		return nil, &baton.ConfigError{Problems: []string{ErrCluster.Error() + " (the server has cluster-enabled yes)"}}
	}
	b := &Backend{c: client, o: o, id: randomID(), held: map[string]*term{}, inflight: map[*int]time.Time{}, seen: map[string]uint64{}}
	b.sessions = backend.NewSessionManager(driver{b}, backend.SessionOptions[string]{
		Backend:      "redis",
		Config:       o.cfg,
		GrantTimeout: o.cfg.TTL,
		AbandonFor:   o.cfg.TTL,
		Describe:     func(id string) string { return "redis renewals " + id },
		Lost:         "lost its keys",
		Log:          o.log,
	})
	b.listen = newListener(b)
	if !o.NoPubSub {
		b.sessions.Go(func() { b.listen.run(b.sessions.Context()) })
	} else {
		b.listen.off("Options.NoPubSub is set")
	}
	return b, nil
}

// Config returns the timing the Backend uses, defaults filled in.
func (b *Backend) Config() backend.Config { return b.o.cfg }

// Close ends every term of this Backend (Err wraps baton.ErrClosed),
// deletes its lease keys in one script call (which publishes each on the
// channel, waking the waiters), and waits for its goroutines, within ctx.
// The client is the caller's and stays open.
func (b *Backend) Close(ctx context.Context) error {
	return b.sessions.Close(ctx, nil)
}

// Keys are the names of the keys of lease name.
type Keys struct {
	// Lease holds the holder while the lease is held, and expires a TTL
	// after its last renewal: a redsync mutex of the same name uses it.
	Lease string
	// Token holds the lease's last fencing token; it is never deleted.
	Token string
	// State holds the lease's state (baton.StateTerm).
	State string
	// Queue holds the processes waiting for the lease, first come first
	// (a sorted set of process IDs, scored by when each joined): a
	// release wakes only the first live one, on its process channel
	// (WakeChannel).
	Queue string
	// Waiting holds, for each process in Queue, the server time (ms) until
	// which its entry stands unrefreshed (a sorted set): a process that
	// stopped reading its lease is passed over.
	Waiting string
}

// KeysOf returns the keys of lease name under prefix (empty:
// DefaultPrefix).
func KeysOf(prefix, name string) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Keys{Lease: prefix + "lease:" + name, Token: prefix + "token:" + name, State: prefix + "state:" + name,
		Queue: prefix + "queue:" + name, Waiting: prefix + "waiting:" + name}
}

// WakeChannel returns the pub/sub channel under prefix (empty:
// DefaultPrefix) on which the process whose Backend has ID id is woken
// when it heads the queue of a lease that was released: each message is
// the lease key.
func WakeChannel(prefix, id string) string {
	return wakePrefix(prefix) + id
}

func wakePrefix(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + "wake:"
}

// Channel returns the pub/sub channel on which releases are published
// under prefix (empty: DefaultPrefix): each message is a lease key.
func Channel(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + "released"
}

func (b *Backend) keys(name string) Keys { return KeysOf(b.o.Prefix, name) }

// marker is the key whose absence tells that the store is new or lost its
// data: Prefix+"store".
func (b *Backend) marker() string { return b.o.Prefix + "store" }

// MaxNameLen is the longest lease name, in bytes, that Campaign takes.
const MaxNameLen = 1000

// Campaign implements baton.Backend.
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if name == "" || c.ID == "" {
		return nil, fmt.Errorf("redis: lease name and candidate ID must not be empty (name %q, id %q)", name, c.ID)
	}
	if len(name) > MaxNameLen {
		return nil, fmt.Errorf("redis: lease name of %d bytes is longer than %d (redis.MaxNameLen)", len(name), MaxNameLen)
	}
	return b.sessions.Campaign(ctx, name, c.ID, func(sl *backend.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

// stmtCtx bounds one request of a campaign or a release.
func (b *Backend) stmtCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.o.cfg.TTL)
}

func (b *Backend) campaign(ctx context.Context, sl *backend.Slot, name, id string) (baton.Term, error) {
	wake, unsubscribe := b.listen.w.Subscribe(name, true)
	defer unsubscribe()
	k := b.keys(name)
	queued := false
	defer func() {
		if queued {
			b.leave(k)
		}
	}()
	for {
		s, err := b.sessions.Session(ctx)
		if err != nil {
			return nil, err
		}
		t, left, err := b.tryAcquire(ctx, s, sl, name, id, k)
		if t != nil {
			queued = false // the acquisition took the process out of the queue
		}
		if t != nil || err != nil {
			return t, err
		}
		queued = true
		wait := b.o.poll
		if left > 0 {
			wait = min(wait, left+time.Millisecond)
		}
		timer := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-s.Context().Done():
			timer.Stop()
		case <-wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// tryAcquire runs the acquisition script once. It returns the term, or
// (when the lease is held) how long its key has left to live.
func (b *Backend) tryAcquire(ctx context.Context, s *backend.Session[string], sl *backend.Slot, name, id string, k Keys) (baton.Term, time.Duration, error) {
	now := time.Now()
	b.mu.Lock()
	seen := b.seen[name]
	mark := new(int)
	b.inflight[mark] = now
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.inflight, mark)
		b.mu.Unlock()
	}()
	if seen>>32 != 0 {
		b.epochs.Saw(name, seen>>32)
	}
	fresh := backend.EpochToken(b.epochs.Next(name, now), 1)
	tail := strconv.FormatInt(b.ttlMS(), 10) + " " + strconv.FormatInt(now.UnixMilli(), 10) + " " + id
	sctx, cancel := b.stmtCtx(ctx)
	res, acked, err := b.evalWait(sctx, acquireScript, []string{k.Lease, k.Token, b.marker(), k.Queue, k.Waiting},
		strconv.FormatUint(seen, 10), strconv.FormatUint(fresh, 10), tail, b.ttlMS(), Channel(b.o.Prefix), b.queueID(), b.queueMS())
	cancel()
	if err != nil {
		// It may have landed: delete it if so, while our slot keeps the
		// name claimed.
		b.sessions.CleanClaimed(sl, func() { b.dropLeftover(k.Lease, tail) })
		return nil, 0, b.sessions.CampaignErr(ctx, s, name, "acquire lease", err)
	}
	r, ok := res.([]any)
	if !ok || len(r) != 3 {
		return nil, 0, b.sessions.CampaignErr(ctx, s, name, "acquire lease", fmt.Errorf("unexpected reply %v", res))
	}
	value, _ := r[1].(string)
	got, _ := r[0].(int64)
	if got == 0 && strings.HasSuffix(value, " "+tail) && parseValue(value).baton {
		// Our own acquisition, landed by the client's retry of a request
		// whose reply was lost: it is ours.
		got, r[2] = 1, int64(0)
	}
	if got == 2 {
		if created, _ := r[1].(int64); created == 1 {
			b.o.log.Warn("Redis has no record of baton: a new server, or one that restarted without persistence or was flushed, losing every lease; "+
				"no lease is granted for a TTL, so that the holders of lost leases have stopped",
				"marker", b.marker(), "ttl", b.o.cfg.TTL)
		}
		wait, _ := r[2].(int64)
		return nil, time.Duration(wait) * time.Millisecond, nil
	}
	if got == 0 {
		v := parseValue(value)
		if v.token > 0 {
			b.saw(name, v.token)
		}
		pttl, _ := r[2].(int64)
		return nil, time.Duration(pttl) * time.Millisecond, nil
	}
	v := parseValue(value)
	if lost, _ := r[2].(int64); lost == 1 {
		b.o.log.Error("REDIS LOST WRITES: the lease's token key was missing or below a token this process saw; "+
			"the server restarted without persistence, was restored from an old snapshot, or a failover promoted a replica that had not received them. "+
			"Tokens continue in a new epoch. See docs/backends/redis.md for the persistence and replication settings baton needs",
			"lease", name, "seen_token", seen, "new_token", v.token, "new_epoch", backend.FormatEpoch(v.token>>32))
	}
	if acked < b.o.Replicas {
		b.sessions.CleanClaimed(sl, func() { b.dropLeftover(k.Lease, value) })
		return nil, 0, b.sessions.CampaignErr(ctx, s, name, "acquire lease",
			fmt.Errorf("%d of the %d replicas (Options.Replicas) acknowledged the acquisition within %s: a failover could lose it", acked, b.o.Replicas, b.o.wait))
	}
	b.saw(name, v.token)
	t := &term{b: b, name: name, keys: k, value: value}
	// Renewals sent until t is in held leave its key out; the in-flight
	// mark keeps them from counting past its acquisition's send time.
	_, err = b.sessions.Start(s, sl, name, v.token, t.release, backend.StartOptions{
		Watch:   func() {},
		Started: func(bt *backend.BasicTerm) { t.BasicTerm = bt },
	})
	if err != nil {
		b.sessions.CleanClaimed(sl, func() { b.dropLeftover(k.Lease, value) })
		return nil, 0, err
	}
	b.mu.Lock()
	b.held[name] = t
	b.mu.Unlock()
	b.o.log.Debug("acquired", "lease", name, "token", v.token)
	return t, 0, nil
}

// queueID is the ID under which this process queues for leases, or ""
// when pub/sub is off: a process that is not woken does not queue.
func (b *Backend) queueID() string {
	if b.o.NoPubSub {
		return ""
	}
	return b.id
}

// queueMS is how long (ms) a queue entry stands unrefreshed: a waiting
// process refreshes it on each read of its lease, at least every
// PollInterval, and an entry left three of them without one belongs to a
// process that stopped waiting (or stopped), which a release passes over.
func (b *Backend) queueMS() int64 {
	return 3 * b.o.poll.Milliseconds()
}

// releaseKeys returns the keys releaseScript takes for lease key key.
func (b *Backend) releaseKeys(key string) []string {
	name := strings.TrimPrefix(key, b.o.Prefix+"lease:")
	k := b.keys(name)
	return []string{k.Lease, k.Queue, k.Waiting}
}

// leave takes this process out of the queue of the lease whose keys are
// k, passing on a wake-up it may have been sent, in the background:
// bounded by RenewInterval, and by Close. A leave that fails leaves an
// entry that lapses by itself (queueMS), and a wake-up sent to it is
// passed on when it arrives (listener.run).
func (b *Backend) leave(k Keys) {
	b.sessions.Go(func() {
		ctx, cancel := context.WithTimeout(b.sessions.Context(), b.o.cfg.RenewInterval)
		defer cancel()
		if _, _, err := b.evalWait(ctx, leaveScript, []string{k.Lease, k.Queue, k.Waiting}, b.id, wakePrefix(b.o.Prefix)); err != nil {
			b.o.log.Debug("could not leave a lease's queue; the entry lapses by itself", "key", k.Queue, "err", err)
		}
	})
}

// saw records token as seen for lease name.
func (b *Backend) saw(name string, token uint64) {
	b.mu.Lock()
	if token > b.seen[name] {
		b.seen[name] = token
	}
	b.mu.Unlock()
	if token>>32 != 0 {
		b.epochs.Report(b.o.log, backend.EpochLocation{Store: "Redis", Counter: "lease tokens", Lease: name, Kind: "key", Key: b.keys(name).Token}, token>>32)
	}
}

// forget removes t from the leases renewed.
func (b *Backend) forget(t *term) {
	b.mu.Lock()
	if b.held[t.name] == t {
		delete(b.held, t.name)
	}
	b.mu.Unlock()
}

// dropLeftover deletes key if it holds value, in the background after a
// failed acquisition or start.
func (b *Backend) dropLeftover(key, valueOrTail string) {
	backend.Retry(b.sessions.Context(), b.o.cfg.RenewInterval/4, b.o.cfg.RenewInterval, true, func(ctx context.Context) error {
		v, err := b.c.Get(ctx, key).Result()
		if err == goredis.Nil {
			return nil
		}
		if err != nil {
			return err
		}
		if v != valueOrTail && !strings.HasSuffix(v, " "+valueOrTail) {
			return nil
		}
		_, _, err = b.evalWait(ctx, releaseScript, b.releaseKeys(key), Channel(b.o.Prefix), wakePrefix(b.o.Prefix), v)
		return err
	})
}

// value is a lease key's value as baton writes it:
// "baton TOKEN TTLMS SINCEMS HOLDER". Any other value is a foreign holder's
// (a redsync mutex).
type value struct {
	baton  bool
	token  uint64
	ttl    time.Duration
	since  time.Time
	holder string
}

func parseValue(s string) value {
	f := strings.SplitN(s, " ", 5)
	if len(f) != 5 || f[0] != "baton" {
		return value{holder: s}
	}
	tok, err1 := strconv.ParseUint(f[1], 10, 64)
	ttl, err2 := strconv.ParseInt(f[2], 10, 64)
	since, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return value{holder: s}
	}
	return value{baton: true, token: tok, ttl: time.Duration(ttl) * time.Millisecond, since: time.UnixMilli(since), holder: f[4]}
}

// ForeignHolder is the Holder that Leader reports for a lease key written
// by another program (a redsync mutex), followed by the key's value.
const ForeignHolder = "foreign:"

// Leader implements baton.Backend. It reports what the lease key says: a
// holder that died stays named until its key expires, a TTL after its
// last renewal. A key another program holds (a redsync mutex of the same
// name) is reported with Holder ForeignHolder+value and Token 0.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	rec, _, err := b.read(ctx, name)
	return rec, err
}

// read is Leader that also returns how long the lease key has left to
// live (0 when unknown or absent).
func (b *Backend) read(ctx context.Context, name string) (baton.Record, time.Duration, error) {
	sctx, cancel := b.stmtCtx(ctx)
	defer cancel()
	k := b.keys(name).Lease
	pipe := b.c.Pipeline()
	get := pipe.Get(sctx, k)
	pttl := pipe.PTTL(sctx, k)
	_, _ = pipe.Exec(sctx)
	s, err := get.Result()
	if err == goredis.Nil {
		return baton.Record{}, 0, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	if err != nil {
		return baton.Record{}, 0, backend.Unavailable(ctx, "redis: read lease "+name, err)
	}
	left := max(pttl.Val(), 0)
	v := parseValue(s)
	if !v.baton {
		return baton.Record{Lease: name, Holder: ForeignHolder + s}, left, nil
	}
	b.saw(name, v.token)
	return baton.Record{Lease: name, Holder: v.holder, Token: v.token, Since: v.since}, left, nil
}

// term is a term of a lease on this Backend.
type term struct {
	*backend.BasicTerm
	b     *Backend
	name  string
	keys  Keys
	value string
}

// release deletes the lease key if this term still holds it, and
// publishes the release, in one script call.
func (t *term) release(ctx context.Context) error {
	t.b.forget(t)
	sctx, cancel := t.b.stmtCtx(ctx)
	defer cancel()
	if _, _, err := t.b.evalWait(sctx, releaseScript, []string{t.keys.Lease, t.keys.Queue, t.keys.Waiting}, Channel(t.b.o.Prefix), wakePrefix(t.b.o.Prefix), t.value); err != nil {
		return fmt.Errorf("redis: release lease %q (its key expires a TTL after its last renewal): %w", t.name, err)
	}
	return nil
}

// LoadState implements baton.StateTerm.
func (t *term) LoadState(ctx context.Context) ([]byte, error) {
	sctx, cancel := t.b.stmtCtx(ctx)
	defer cancel()
	v, err := t.b.c.Get(sctx, t.keys.State).Bytes()
	if err == goredis.Nil {
		return nil, nil
	}
	if err != nil {
		return nil, backend.Unavailable(ctx, "redis: load state of lease "+t.name, err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}

// StoreState implements baton.StateTerm: one script that sets the state
// while the lease key holds this term's value.
func (t *term) StoreState(ctx context.Context, value []byte) error {
	return backend.StoreState(ctx, t, value, func(ctx context.Context, value []byte) error {
		sctx, cancel := context.WithDeadline(ctx, t.SafeUntil())
		defer cancel()
		res, acked, err := t.b.evalWait(sctx, storeStateScript, []string{t.keys.Lease, t.keys.State}, t.value, value)
		if err != nil {
			if e := t.Err(); e != nil {
				return backend.EndedError(t)
			}
			return backend.Unavailable(ctx, "redis: store state of lease "+t.name, err)
		}
		if n, _ := res.(int64); n == 0 {
			err := fmt.Errorf("%w: lease %q is no longer held by token %d", baton.ErrLeaseLost, t.name, t.Token())
			t.End(err)
			return err
		}
		if acked < t.b.o.Replicas {
			return backend.Unavailable(ctx, "redis: store state of lease "+t.name,
				fmt.Errorf("%d of the %d replicas acknowledged it", acked, t.b.o.Replicas))
		}
		return nil
	})
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ttlMS is the TTL in whole milliseconds, rounded up.
func (b *Backend) ttlMS() int64 {
	return int64((b.o.cfg.TTL + time.Millisecond - 1) / time.Millisecond)
}
