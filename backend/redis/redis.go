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
	"sync/atomic"
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

	// base is the monotonic origin of the stamps of queue entries
	// (stampOf): a stamp is microseconds since base.
	base time.Time

	mu       sync.Mutex
	held     map[string]*term // lease name -> the live term's key and value
	inflight map[*int]time.Time
	seen     map[string]uint64 // the highest token seen per lease
	// waits are the campaigns waiting in a queue, by lease name: the
	// stamps they sent, for checking a grant's.
	waits map[string]*waitStamps
	// grants are the grants heard for a lease, not yet taken by its
	// campaign.
	grants map[string]grant
}

// waitStamps are the stamps one campaign sent with its queue entry.
type waitStamps struct {
	id          string // the candidate
	first, last int64  // the first and latest stamps sent
}

// grant is a lease a release granted this process (wakeHeadLua).
type grant struct {
	stamp int64
	value string
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
	b := &Backend{c: client, o: o, id: randomID(), base: time.Now(), held: map[string]*term{}, inflight: map[*int]time.Time{}, seen: map[string]uint64{},
		waits: map[string]*waitStamps{}, grants: map[string]grant{}}
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
	// Woken holds, for a moment after a release woke the first process in
	// Queue (a fraction of the TTL, at most a second: see wakeGrace), that
	// process's ID: the free lease is its alone meanwhile, so that a
	// candidate that did not wait in the queue, such as the resigner's own
	// next candidate, queues behind it rather than taking the lease first.
	Woken string
	// Stamps is the prefix of the grant entries of the processes in
	// Queue: key Stamps+":"+ID holds "STAMP GRANTMS HOLDER", for as long
	// as the process's queue entry stands. A release grants the free
	// lease to the head of the queue directly, as a term of HOLDER that
	// expires in GRANTMS unless the head renews it, and sends
	// the head STAMP, which the head put in its latest refresh of the
	// entry: the head counts the term's safe-until from that refresh's
	// send time, which preceded the grant.
	Stamps string
}

// KeysOf returns the keys of lease name under prefix (empty:
// DefaultPrefix).
func KeysOf(prefix, name string) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Keys{Lease: prefix + "lease:" + name, Token: prefix + "token:" + name, State: prefix + "state:" + name,
		Queue: prefix + "queue:" + name, Waiting: prefix + "waiting:" + name, Woken: prefix + "woken:" + name,
		Stamps: prefix + "stamp:" + name}
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
	k := b.keys(name)
	queued := false
	b.mu.Lock()
	b.waits[name] = &waitStamps{id: id, first: -1}
	b.mu.Unlock()
	defer func() {
		unsubscribe()
		b.mu.Lock()
		delete(b.waits, name)
		b.mu.Unlock()
		// A grant heard after the campaign ended is passed on.
		if g, ok := b.takeGrant(name); ok {
			b.passOn(k.Lease, g.value)
		}
		if queued {
			b.leave(k)
		}
	}()
	for {
		s, err := b.sessions.Session(ctx)
		if err != nil {
			return nil, err
		}
		if g, ok := b.takeGrant(name); ok {
			t, err := b.takeGranted(s, sl, name, id, k, g)
			if t != nil || err != nil {
				queued = false
				return t, err
			}
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

// stampOf is the stamp of a request sent at at: microseconds since
// b.base, on the monotonic clock.
func (b *Backend) stampOf(at time.Time) int64 { return at.Sub(b.base).Microseconds() }

// takeGrant takes the grant heard for lease name, if any.
func (b *Backend) takeGrant(name string) (grant, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g, ok := b.grants[name]
	delete(b.grants, name)
	return g, ok
}

// granted hands a grant heard on the process channel to the campaign for
// its lease, or passes it on when none waits.
func (b *Backend) granted(key string, g grant) {
	name := strings.TrimPrefix(key, b.o.Prefix+"lease:")
	b.mu.Lock()
	b.grants[name] = g
	b.mu.Unlock()
	b.o.log.Debug("granted", "lease", name)
	if !b.listen.w.Wake(name, true) {
		if g, ok := b.takeGrant(name); ok {
			b.passOn(key, g.value)
		}
	}
}

// passOn releases a lease granted to this process that it does not take,
// in the background: the release grants it to the next process. A value
// that a live term of this process holds is its own, and stays.
func (b *Backend) passOn(key, value string) {
	name := strings.TrimPrefix(key, b.o.Prefix+"lease:")
	b.mu.Lock()
	t := b.held[name]
	b.mu.Unlock()
	if t != nil && t.value == value && t.Err() == nil {
		return
	}
	b.sessions.Go(func() { b.dropLeftover(key, value) })
}

// grantMS is how long (ms) a key granted to this process by a release
// lives unless renewed (wakeHeadLua): the TTL less a millisecond. The
// term counts from the send of the stamp the grant carries, which may be
// up to a PollInterval old, and must start with more left than an
// Elector's StopEarly (below the renewal window) or the Elector resigns
// it at once: so nearly a full TTL. The millisecond tells a granted value
// from the process's own acquisition (whose value carries the full TTL).
func (b *Backend) grantMS() int64 { return max(1, b.ttlMS()-1) }

// takeGranted starts the term a release granted this process (g), or
// passes the lease on and returns nothing when the grant is not one it
// can count safely: not for candidate id, a stamp this campaign did not
// send, a token not above every token seen, or too old to act on.
//
// The term's safe-until is counted from the send time of the request
// that carried g's stamp, which the server executed before the grant:
// the granted key expires grantMS after the grant, so the term is safe
// until that send time plus grantMS, less DriftMargin; never from when
// the grant was heard, which may be long after it. A renewal of the key that
// this process sends itself lifts the cap (confirmGrant, and the
// renewals of the session).
func (b *Backend) takeGranted(s *backend.Session[string], sl *backend.Slot, name, id string, k Keys, g grant) (baton.Term, error) {
	v := parseValue(g.value)
	b.mu.Lock()
	w := b.waits[name]
	seen := b.seen[name]
	b.mu.Unlock()
	grace := time.Duration(b.grantMS()) * time.Millisecond
	ok := v.baton && v.holder == id && w != nil && w.id == id && w.first >= 0 &&
		g.stamp >= w.first && g.stamp <= w.last && v.token > seen && v.ttl == grace
	if !ok {
		b.o.log.Debug("a grant this campaign cannot count on: passed on", "lease", name, "value", g.value)
		b.passOn(k.Lease, g.value)
		return nil, nil
	}
	sent := b.base.Add(time.Duration(g.stamp) * time.Microsecond)
	capUntil := b.o.cfg.SafeUntil(sent, grace)
	b.saw(name, v.token)
	t := &term{b: b, name: name, keys: k, value: g.value, session: s.ID, sess: s}
	t.capped.Store(true)
	_, err := b.sessions.Start(s, sl, name, v.token, t.release, backend.StartOptions{
		Watch:   func() {},
		Started: func(bt *backend.BasicTerm) { t.BasicTerm = bt },
		Cap:     capUntil,
	})
	if err != nil {
		b.o.log.Debug("a grant heard too late to act on: passed on", "lease", name, "err", err)
		b.sessions.CleanClaimed(sl, func() { b.dropLeftover(k.Lease, g.value) })
		if errors.Is(err, baton.ErrClosed) {
			return nil, err
		}
		return nil, nil
	}
	b.mu.Lock()
	b.held[name] = t
	b.mu.Unlock()
	b.sessions.Go(func() { b.confirmGrant(t) })
	b.o.log.Debug("acquired by grant", "lease", name, "token", v.token)
	return t, nil
}

// confirmGrant renews a granted term's key at once, in one round trip
// sent after the term was registered for renewals: its reply lifts the
// term's cap (or ends the term when the key is gone). A failure leaves the
// cap to the session's next renewal, which covers the key too.
func (b *Backend) confirmGrant(t *term) {
	ctx, cancel := context.WithDeadline(b.sessions.Context(), t.SafeUntil())
	defer cancel()
	sent := time.Now()
	res, acked, err := b.evalWait(ctx, renewScript, []string{t.keys.Lease}, b.ttlMS(), t.value)
	if err != nil || acked < b.o.Replicas {
		b.o.log.Debug("could not confirm a granted lease; the next renewal does", "lease", t.name, "err", err)
		return
	}
	if lost, _ := res.([]any); len(lost) > 0 {
		b.forget(t)
		t.End(fmt.Errorf("%w: lease %q: its granted key %s expired before this process confirmed it", baton.ErrLeaseLost, t.name, t.keys.Lease))
		return
	}
	t.uncap(b.o.cfg.SafeUntil(sent, b.o.cfg.TTL))
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
	entry := ""
	// With Options.Replicas, a lease is held only once the replicas have
	// the write that took it, which a grant's holder cannot know: such a
	// process is woken, and acquires by its own script and WAIT.
	if b.o.Grant && b.queueID() != "" && b.o.Replicas == 0 && !strings.Contains(id, "\x00") {
		stamp := b.stampOf(now)
		b.mu.Lock()
		if w := b.waits[name]; w != nil && w.id == id {
			if w.first < 0 {
				w.first = stamp
			}
			w.last = stamp
			entry = strconv.FormatInt(stamp, 10) + " " + strconv.FormatInt(b.grantMS(), 10) + " " + id
		}
		b.mu.Unlock()
	}
	sctx, cancel := b.stmtCtx(ctx)
	res, acked, err := b.evalWait(sctx, acquireScript, []string{k.Lease, k.Token, b.marker(), k.Queue, k.Waiting, k.Woken, k.Stamps},
		strconv.FormatUint(seen, 10), strconv.FormatUint(fresh, 10), tail, b.ttlMS(), Channel(b.o.Prefix), b.queueID(), b.queueMS(), entry)
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
		if v.token > 0 && !(v.holder == id && v.ttl == time.Duration(b.grantMS())*time.Millisecond) {
			// (A value granted to this campaign is not seen: its grant,
			// heard on the process channel, is checked against the tokens
			// seen before it.)
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
	t := &term{b: b, name: name, keys: k, value: value, session: s.ID}
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
	return []string{k.Lease, k.Queue, k.Waiting, k.Woken, k.Token, k.Stamps}
}

// wakeGrace is how long (ms) a release keeps the free lease for the
// process it woke (Keys.Woken): a live process takes it within
// milliseconds; one that was woken but cannot act (stopped, its campaign
// ended without leaving the queue) delays the lease's next holder by this
// much at most. A tenth of the TTL, at most a second.
func (b *Backend) wakeGrace() int64 {
	return max(1, min(b.o.cfg.TTL/10, time.Second).Milliseconds())
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
		if _, _, err := b.evalWait(ctx, leaveScript, []string{k.Lease, k.Queue, k.Waiting, k.Woken, k.Stamps}, b.id, wakePrefix(b.o.Prefix), b.wakeGrace()); err != nil {
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
		_, _, err = b.evalWait(ctx, releaseScript, b.releaseKeys(key), Channel(b.o.Prefix), wakePrefix(b.o.Prefix), b.wakeGrace(), v)
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
	return b.recordOf(name, s), max(pttl.Val(), 0), nil
}

// recordOf is what Leader says of lease name whose key holds s.
func (b *Backend) recordOf(name, s string) baton.Record {
	v := parseValue(s)
	if !v.baton {
		return baton.Record{Lease: name, Holder: ForeignHolder + s}
	}
	b.saw(name, v.token)
	return baton.Record{Lease: name, Holder: v.holder, Token: v.token, Since: v.since}
}

var _ baton.LeadersReader = (*Backend)(nil)

// Leaders implements baton.LeadersReader: what Leader says of each name,
// from one pipeline of reads: one round trip for all of them.
func (b *Backend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	recs, errs := make([]baton.Record, len(names)), make([]error, len(names))
	if len(names) == 0 {
		return recs, errs
	}
	sctx, cancel := b.stmtCtx(ctx)
	defer cancel()
	pipe := b.c.Pipeline()
	gets := make([]*goredis.StringCmd, len(names))
	for i, name := range names {
		gets[i] = pipe.Get(sctx, b.keys(name).Lease)
	}
	_, _ = pipe.Exec(sctx)
	for i, name := range names {
		s, err := gets[i].Result()
		switch {
		case err == goredis.Nil:
			errs[i] = fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
		case err != nil:
			errs[i] = backend.Unavailable(ctx, "redis: read lease "+name, err)
		default:
			recs[i] = b.recordOf(name, s)
		}
	}
	return recs, errs
}

// term is a term of a lease on this Backend.
type term struct {
	*backend.BasicTerm
	b     *Backend
	name  string
	keys  Keys
	value string
	// session is the ID of the session whose renewals extend the term:
	// only they renew its key, and only its revocation deletes it.
	session string
	// sess and capped, for a term granted by a release: its safe-until is
	// capped (backend.StartOptions.Cap) until a renewal of its key that
	// this process sent is confirmed. An atomic, so that the session's
	// renewal, which looks at every held term, takes no lock for it.
	sess   *backend.Session[string]
	capped atomic.Bool
}

// uncap lifts a granted term's cap once a renewal of its key, confirmed
// until until, was sent by this process.
func (t *term) uncap(until time.Time) {
	if t.capped.CompareAndSwap(true, false) {
		t.sess.Uncap(t.BasicTerm, until)
	}
}

// release deletes the lease key if this term still holds it, and
// publishes the release, in one script call.
func (t *term) release(ctx context.Context) error {
	t.b.forget(t)
	sctx, cancel := t.b.stmtCtx(ctx)
	defer cancel()
	if _, _, err := t.b.evalWait(sctx, releaseScript, t.b.releaseKeys(t.keys.Lease), Channel(t.b.o.Prefix), wakePrefix(t.b.o.Prefix), t.b.wakeGrace(), t.value); err != nil {
		return fmt.Errorf("redis: release lease %q (its key expires a TTL after its last renewal): %w", t.name, err)
	}
	t.b.o.log.Debug("released", "lease", t.name, "token", t.Token())
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
