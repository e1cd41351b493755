package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/epoch"
	"github.com/batonhq/baton/internal/renew"
	"github.com/hashicorp/consul/api"
)

// Defaults applied by New when an Options field is zero.
const (
	// DefaultTTL is the TTL when Options.TTL is zero: twice Consul's
	// default session_ttl_min (10 s), because the session TTL baton asks
	// Consul for is TTL/2 (see the package doc).
	DefaultTTL = 20 * time.Second

	// DefaultPrefix is the key prefix when Options.Prefix is empty.
	DefaultPrefix = "baton/"

	// DefaultSessionName is the session name when Options.SessionName is
	// empty.
	DefaultSessionName = "baton"

	// MaxLockDelay is the longest lock-delay Consul applies (structs.MaxLockDelay);
	// it silently caps longer ones, so New refuses them.
	MaxLockDelay = 60 * time.Second

	// lockKey is the key below a lease's prefix, as `consul lock` names it
	// (api.DefaultSemaphoreKey).
	lockKey = ".lock"

	// watchWait is the wait time of the Backend's blocking query. An idle
	// watch re-reads its keys this often; a change wakes it at once.
	watchWait = time.Minute
)

// Options configures a Backend. The zero value means the documented
// defaults. Options is a plain value and safe to copy.
type Options struct {
	backend.
		// Config holds TTL, RenewInterval and DriftMargin. On Consul, zero
		// values mean: TTL DefaultTTL (20 s); RenewInterval TTL/6 (a third of
		// the session TTL, TTL/2, so that two more renewals fit before the
		// holder's deadline); DriftMargin TTL/10. RenewInterval must be below
		// TTL/2 − DriftMargin, the holder's safe window (see the package doc).
		Config

	// Prefix goes in front of every lease name: lease NAME is held at key
	// Prefix + NAME + "/.lock", exactly the key of `consul lock
	// Prefix+NAME`, so that the two exclude each other. Empty means
	// DefaultPrefix ("baton/"). It must not begin with "/", and Prefix+NAME
	// must be a clean path (no "//", "." or ".." segments, no trailing "/"),
	// or the CLI would compute a different key. The ACL token needs
	// key:write on it.
	Prefix string

	// LockDelay is the session's lock-delay: after Consul invalidates the
	// session (its TTL ran out, a health check failed, or someone destroyed
	// it), the keys it held cannot be locked again for this long. Zero
	// means RenewInterval without Checks, and the session TTL (TTL/2) with
	// Checks; with Checks it must be at least the session TTL. It must not
	// exceed MaxLockDelay (60 s). Explicit releases (Resign, Close) are
	// not delayed. See the package doc for the trade-off against Consul's
	// own default of 15 s.
	LockDelay time.Duration

	// Checks are node health check IDs (such as "serfHealth", Consul's
	// default) that Consul ties to the session: when one fails, Consul
	// invalidates the session at once and every lease riding on it is
	// lost. Empty (the default) means none: the session lives by its TTL
	// alone, renewed by this process, which is the better signal of this
	// process being alive than its node's health.
	Checks []string

	// ServiceChecks are service health checks tied to the session, as
	// Checks.
	ServiceChecks []api.ServiceCheck

	// SessionName names the session, as /v1/session/list and the UI show
	// it. Empty means DefaultSessionName ("baton").
	SessionName string

	// Logger receives log lines (group "consul"). Nil (the default) means
	// silent.
	Logger *slog.Logger
}

// Backend runs baton leases on Consul over one session per Backend. It is
// safe for concurrent use. One Backend stands for one process; it may hold
// any number of leases.
type Backend struct {
	client        *api.Client
	kv            *api.KV
	cfg           backend.Config
	sessTTL       time.Duration
	lockDelay     time.Duration
	nodeChecks    []string
	serviceChecks []api.ServiceCheck
	prefix        string
	sessionName   string
	reqTimeout    time.Duration // bounds a single request while campaigning
	log           *slog.Logger

	// ctx bounds the Backend's background work; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// granting admits one caller at a time to create the session, so that a
	// burst of first campaigns shares one session; it is a channel so that
	// waiting honours the caller's ctx.
	granting chan struct{}

	w *watcher

	mu     sync.Mutex
	closed bool
	sess   *session // nil before the first campaign and after a session ended
	helds  map[*held]struct{}
	// slots, guarded by mu, marks the lease names this Backend campaigns
	// for or holds. The key of a name is the same for every campaign of
	// this Backend's session, so two campaigns for one name must not
	// overlap; nor may a new campaign start before an ended term's lock is
	// gone (see finish), or the clean-up of the old term could delete the
	// new term's lock. While a lock that a failed campaign's transaction
	// may have taken is being let go in the background, the name stays
	// claimed, so that the clean-up cannot delete a new campaign's lock.
	slots *renew.Slots

	// epochs follows the epoch keys as read (see epochKey).
	epochs epoch.Tracker
	// now is the wall clock an epoch written is taken from.
	now func() time.Time
}

var _ baton.Backend = (*Backend)(nil)

// New returns a Backend that campaigns through client. The client remains
// the caller's (an *api.Client holds nothing that needs closing); its
// address, ACL token (api.Config.Token) and TLS settings (api.Config.TLSConfig)
// are what the Backend uses. NewClient builds one from a ClientConfig. New
// reports every problem with opts at once, as a *baton.ConfigError.
func New(client *api.Client, opts Options) (*Backend, error) {
	var problems []string
	cfg := opts.Config
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL > 0 && cfg.RenewInterval == 0 {
		cfg.RenewInterval = cfg.TTL / 6
	}
	cfg, err := cfg.WithDefaults()
	var ce *baton.ConfigError
	if errors.As(err, &ce) {
		problems = append(problems, ce.Problems...)
	} else if err != nil {
		return nil, err
	}
	sessTTL := (cfg.TTL/2 + time.Millisecond - 1).Truncate(time.Millisecond)
	if err == nil {
		switch {
		case cfg.DriftMargin >= sessTTL:
			problems = append(problems, fmt.Sprintf("DriftMargin (%s) must be below TTL/2 (%s), the session TTL asked of Consul", cfg.DriftMargin, sessTTL))
		case cfg.RenewInterval >= sessTTL-cfg.DriftMargin:
			problems = append(problems, fmt.Sprintf("RenewInterval (%s) must be below TTL/2 - DriftMargin (%s) on Consul, the holder's safe window: renew more often or raise TTL",
				cfg.RenewInterval, sessTTL-cfg.DriftMargin))
		}
	}
	checks := len(opts.Checks) > 0 || len(opts.ServiceChecks) > 0
	lockDelay := opts.LockDelay
	switch {
	case lockDelay < 0:
		problems = append(problems, fmt.Sprintf("LockDelay (%s) must not be negative", lockDelay))
	case lockDelay > MaxLockDelay:
		problems = append(problems, fmt.Sprintf("LockDelay (%s) must not exceed %s, the most Consul applies", lockDelay, MaxLockDelay))
	case lockDelay == 0 && checks:
		lockDelay = sessTTL
	case lockDelay == 0:
		lockDelay = cfg.RenewInterval
	case checks && lockDelay < sessTTL:
		problems = append(problems, fmt.Sprintf("LockDelay (%s) must be at least the session TTL (%s, TTL/2) when Checks are set: "+
			"a failing check invalidates the session while its holder may still act until its safe-until", lockDelay, sessTTL))
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.HasPrefix(prefix, "/") {
		problems = append(problems, fmt.Sprintf("Prefix %q must not begin with \"/\": `consul lock` strips it, so the two would use different keys", prefix))
	} else if !cleanPath(prefix + "x") {
		problems = append(problems, fmt.Sprintf("Prefix %q must be a clean path prefix (no \"//\", \".\" or \"..\" segments): `consul lock` would clean it and use another key", prefix))
	}
	if client == nil {
		problems = append(problems, "client is nil: pass an *api.Client from api.NewClient or consul.NewClient")
	}
	if len(problems) > 0 {
		return nil, &baton.ConfigError{Problems: problems}
	}
	name := opts.SessionName
	if name == "" {
		name = DefaultSessionName
	}
	nodeChecks := append([]string{}, opts.Checks...)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.WithGroup("consul")
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		now:           time.Now,
		client:        client,
		kv:            client.KV(),
		cfg:           cfg,
		sessTTL:       sessTTL,
		lockDelay:     lockDelay,
		nodeChecks:    nodeChecks,
		serviceChecks: append([]api.ServiceCheck{}, opts.ServiceChecks...),
		prefix:        prefix,
		sessionName:   name,
		reqTimeout:    max(sessTTL, 5*time.Second),
		log:           log,
		ctx:           ctx,
		cancel:        cancel,
		granting:      make(chan struct{}, 1),
		helds:         map[*held]struct{}{},
	}
	b.slots = renew.NewSlots(&b.mu, func() bool { return b.closed }, "consul")
	b.w = newWatcher(ctx, &b.wg, b.kv, watchWait, log)
	return b, nil
}

// Config returns the timing the Backend uses, defaults filled in.
func (b *Backend) Config() backend.Config { return b.cfg }

// SessionTTL returns the session TTL the Backend asks Consul for: TTL/2,
// rounded up to whole milliseconds.
func (b *Backend) SessionTTL() time.Duration { return b.sessTTL }

// LockDelay returns the session lock-delay the Backend asks Consul for,
// defaults filled in.
func (b *Backend) LockDelay() time.Duration { return b.lockDelay }

// Key returns the key at which lease name is held, Prefix + name +
// "/.lock": `consul lock Prefix+name` contends for the same key.
func (b *Backend) Key(name string) (string, error) {
	return Options{Prefix: b.prefix}.Key(name)
}

// Key returns the key at which a Backend with these options holds lease
// name, Prefix + name + "/.lock" (Prefix defaulting to DefaultPrefix), or
// an error if the name or the prefix cannot make a key that `consul lock`
// would use as it is. It needs no client, so that a program can check a
// lease name before it connects.
func (o Options) Key(name string) (string, error) {
	prefix := o.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if name == "" {
		return "", errors.New("consul: lease name must not be empty")
	}
	if !cleanPath(prefix + "x") {
		return "", fmt.Errorf("consul: Prefix %q must be a clean relative path prefix (no leading \"/\", no \"//\", \".\" or \"..\" segments)", prefix)
	}
	if !cleanPath(prefix + name) {
		return "", fmt.Errorf("consul: lease name %q must be a clean path (no leading or trailing \"/\", no \"//\", \".\" or \"..\" segments): "+
			"`consul lock` would clean %q to another key", name, prefix+name)
	}
	return prefix + name + "/" + lockKey, nil
}

// cleanPath reports whether p is a relative path that `consul lock` uses
// as it is: path.Join(p, ".lock") == p + "/.lock", and no "." or ".."
// segments that an HTTP client or server might resolve.
func cleanPath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || path.Join(p, lockKey) != p+"/"+lockKey {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// Campaign implements baton.Backend. A second Campaign for a name this
// Backend already campaigns for or holds returns an error wrapping
// baton.ErrAlreadyCampaigning, whatever the candidate: the Backend's one
// session can hold a lease's key only once. A key held by something other
// than a lock (a `consul lock -n 2` semaphore) gives an error wrapping
// ErrKeyConflict. The term it returns implements baton.StateTerm: its
// state lives at StateKey(name).
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	key, err := b.Key(name)
	if err != nil {
		return nil, err
	}
	if c.ID == "" {
		return nil, fmt.Errorf("consul: candidate ID must not be empty (lease %q)", name)
	}
	return b.slots.Campaign(ctx, name, c.ID, func(sl *renew.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, key, c.ID)
	})
}

// dropLock deletes key if session s holds it, for a campaign whose lock
// transaction failed without a verdict and which holds the name's slot, so
// that the lock can only be that transaction's. It tries once, bounded by
// RenewInterval (the campaign's ctx may be what ended, and Campaign should
// not outlive it by much), and then keeps trying in the background,
// holding the slot, until it succeeds or the session ends (which takes the
// lock with it), as etcd's dropKey does.
func (b *Backend) dropLock(s *session, sl *renew.Slot, name, key string) {
	if s.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, b.cfg.RenewInterval)
	err := b.deleteOwn(ctx, s, key)
	cancel()
	if err == nil {
		return
	}
	b.log.Warn("could not check for a lock left by a failed campaign; retrying in the background", "lease", name, "key", key, "err", err)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return // Close destroys the session, and the lock with it
	}
	done, ok := b.slots.CleaningLocked(sl)
	if !ok {
		b.mu.Unlock()
		return // no longer the name's slot, or already cleaned up after
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		defer done()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(b.cfg.RenewInterval):
			}
			ctx, cancel := context.WithTimeout(s.ctx, b.reqTimeout)
			err := b.deleteOwn(ctx, s, key)
			cancel()
			if err == nil {
				return
			}
			b.log.Debug("lock of a failed campaign not checked yet", "lease", name, "key", key, "err", err)
		}
	}()
}

// deleteOwn deletes key if session s holds it.
func (b *Backend) deleteOwn(ctx context.Context, s *session, key string) error {
	for range 3 {
		p, err := b.get(ctx, key)
		if err != nil {
			return err
		}
		if p == nil || p.Session != s.id {
			return nil
		}
		err = b.deleteCAS(ctx, key, p.ModifyIndex)
		if err == nil {
			b.log.Info("deleted a lock that a failed campaign's transaction took", "key", key, "index", p.ModifyIndex)
			return nil
		}
		if !errors.Is(err, errCASFailed) {
			return err
		}
	}
	return fmt.Errorf("consul: lock key %s keeps changing under our session", key)
}

// lockOutcome is what one attempt to lock a key came to.
type lockOutcome int

const (
	locked  lockOutcome = iota
	changed             // the key changed since it was read: read it again
	refused             // lock-delay, or our session is gone
)

func (b *Backend) campaign(ctx context.Context, sl *renew.Slot, name, key, id string) (baton.Term, error) {
	s, err := b.session(ctx)
	if err != nil {
		return nil, err
	}
	var sb *sub
	defer func() { b.w.unsubscribe(sb) }() // nil once handed to the term
	// The first look is a plain read, so that an uncontended campaign costs
	// a read and a transaction and no watch.
	pair, err := b.get(ctx, key)
	if err != nil {
		return nil, b.campaignErr(ctx, s, name, "read "+key, err)
	}
	var (
		st          = state{pair: pair}
		after       uint64        // the seq of the last state acted on
		retry       time.Duration // when positive: try again after this long even if nothing changed
		backoff     time.Duration // for lock-delays of unknown length
		holder      string        // the last session seen holding the key
		holderDelay time.Duration // its lock-delay, when known
		freedAt     time.Time     // when we saw holder's lock go
		newSession  bool          // a second session was started for this campaign
	)
	for {
		retry = 0
		switch p := st.pair; {
		case st.err != nil:
			return nil, b.campaignErr(ctx, s, name, "watch "+key, st.err)
		case p != nil && p.Flags != api.LockFlagValue:
			return nil, conflictErr(key, p.Flags)
		case p != nil && p.Session == s.id:
			// Our session's lock without a term: the slot forbids it, but
			// should it happen, waiting would never end.
			b.log.Warn("deleting a lock of our session that no term holds", "lease", name, "key", key, "index", p.ModifyIndex)
			if err := b.deleteCAS(ctx, key, p.ModifyIndex); err != nil && !errors.Is(err, errCASFailed) {
				return nil, b.campaignErr(ctx, s, name, "delete "+key, err)
			}
			if sb != nil {
				b.w.refresh(sb) // we changed the key: look again, whatever it shows
			}
		case p != nil && p.Session != "":
			if p.Session != holder {
				holder, holderDelay, freedAt = p.Session, b.lockDelayOf(ctx, p.Session), time.Time{}
			}
		default:
			if holder != "" && freedAt.IsZero() {
				freedAt = time.Now()
			}
			// Should the lock lose a race (someone else's write came
			// between the state we act on and our transaction), the key
			// may be back in that state by the watch's next answer
			// (locked and deleted again), which would then not wake us:
			// ask for that answer regardless. Asked before the
			// transaction, not after its failure, because the answer may
			// arrive in between, and would then be swallowed. A term
			// that wins ignores the one spurious wake-up.
			if sb != nil {
				b.w.refresh(sb)
			}
			index, ep, outcome, err := b.lock(ctx, s, name, key, id, p)
			if err != nil {
				// The transaction may have landed though its answer was
				// lost (ctx ended, a timeout, a dropped connection). Our
				// session would then hold the key with no term to release
				// it, blocking every other candidate for as long as this
				// Backend lives.
				if !errors.Is(err, ErrPermissionDenied) {
					b.dropLock(s, sl, name, key)
				}
				return nil, b.campaignErr(ctx, s, name, "lock "+key, err)
			}
			switch outcome {
			case locked:
				t, err := b.hold(s, sl, name, key, index, epoch.Token(ep, index), sb)
				sb = nil
				return t, err
			case changed:
				// Lost a race: the watch's next answer wakes us (see the
				// refresh above).
			case refused:
				alive, err := b.alive(ctx, s)
				if err != nil {
					return nil, b.campaignErr(ctx, s, name, "look up session "+s.id, err)
				}
				if !alive {
					b.endSession(s, b.lostErr(s))
					if newSession {
						return nil, b.campaignErr(ctx, s, name, "lock "+key, errSessionGone)
					}
					newSession = true
					if s, err = b.session(ctx); err != nil {
						return nil, err
					}
					continue
				}
				// A lock-delay. Its end is known when we saw the lock of a
				// session whose delay we looked up go; otherwise back off.
				if holderDelay > 0 && !freedAt.IsZero() && backoff == 0 {
					retry = holderDelay - time.Since(freedAt) + 10*time.Millisecond
				}
				if retry <= 0 {
					backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
					retry = backoff
				}
				b.log.Debug("lock-delay in effect; trying again later", "lease", name, "key", key, "retry_in", retry)
			}
		}
		if sb == nil {
			if sb = b.w.subscribe(key); sb == nil {
				return nil, baton.ErrClosed
			}
		}
		next, fresh, err := b.w.next(ctx, sb, after, retry, s.ctx.Done())
		if err != nil {
			return nil, b.campaignErr(ctx, s, name, "wait for "+key, err)
		}
		if fresh {
			if !samePair(next.pair, st.pair) {
				backoff = 0
			}
			st, after = next, next.seq
		}
	}
}

// lock tries once to lock key for candidate id with session s, provided
// key is still as seen (nil: absent). It returns the ModifyIndex Consul
// gave the key as it locked it, read from the transaction's own result so
// that no later write can be mistaken for it, and the lease's epoch, read
// in the same transaction (see epochKey).
func (b *Backend) lock(ctx context.Context, s *session, name, key, id string, seen *api.KVPair) (uint64, uint64, lockOutcome, error) {
	guard := &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: key}
	if seen != nil {
		guard = &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: seen.ModifyIndex}
	}
	ekey := epochKey(key)
	ops := api.TxnOps{
		{KV: guard},
		{KV: &api.KVTxnOp{Verb: api.KVGet, Key: ekey}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Value: []byte(id), Flags: api.LockFlagValue, Session: s.id}},
	}
	for range 3 {
		resp, ok, err := b.txn(ctx, ops)
		if err != nil {
			return 0, 0, 0, err
		}
		if !ok {
			noEpoch := false
			for _, e := range resp.Errors {
				switch e.OpIndex {
				case 0:
					return 0, 0, changed, nil
				case 1:
					noEpoch = true
				}
			}
			if noEpoch {
				if err := b.createEpoch(ctx, name, ekey); err != nil {
					return 0, 0, 0, err
				}
				continue
			}
			// Consul checks lock-delays before the transaction reaches raft,
			// and a vanished session fails the lock op itself.
			return 0, 0, refused, nil
		}
		var (
			index uint64
			ep    *api.KVPair
		)
		for _, r := range resp.Results {
			switch kv := r.KV; {
			case kv == nil:
			case kv.Key == ekey:
				ep = &api.KVPair{Key: kv.Key, Value: kv.Value}
			case kv.Key == key && kv.Session == s.id:
				index = kv.ModifyIndex
			}
		}
		if index == 0 {
			return 0, 0, 0, fmt.Errorf("consul: the transaction that locked %s returned no entry for it", key)
		}
		e, err := b.sawEpoch(name, ep)
		if err != nil {
			return 0, 0, 0, err
		}
		return index, e, locked, nil
	}
	return 0, 0, 0, fmt.Errorf("consul: epoch key %s keeps vanishing", ekey)
}

// txn runs ops as one transaction, through Raw rather than api.Txn, whose
// errors other than a failed transaction are untyped: a 403 must be told
// apart. ok is false when Consul refused the transaction (409), and then
// resp.Errors says which ops failed. An ACL refusal, of the request or of
// an op (Consul reports those as text only, and recognises them by the
// same words: acl.IsErrPermissionDenied), wraps ErrPermissionDenied.
func (b *Backend) txn(ctx context.Context, ops api.TxnOps) (resp api.TxnResponse, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	_, err = b.client.Raw().Write("/v1/txn", ops, &resp, (&api.WriteOptions{}).WithContext(ctx))
	var se api.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusConflict {
		return resp, err == nil, permissionErr(err)
	}
	resp = api.TxnResponse{}
	if jerr := json.Unmarshal([]byte(se.Body), &resp); jerr != nil {
		return resp, false, fmt.Errorf("consul: decode failed transaction: %w (%w)", jerr, err)
	}
	for _, e := range resp.Errors {
		if strings.Contains(e.What, "Permission denied") {
			return resp, false, fmt.Errorf("%w: %s", ErrPermissionDenied, e.What)
		}
	}
	return resp, false, nil
}

// lockDelayOf looks up the lock-delay of session id while it still exists,
// so that a waiter knows how long a lock it saw invalidated stays
// unavailable. It returns zero when it cannot tell.
func (b *Backend) lockDelayOf(ctx context.Context, id string) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	info, _, err := b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || info == nil {
		return 0
	}
	return info.LockDelay
}

// get reads key with a consistent read.
func (b *Backend) get(ctx context.Context, key string) (*api.KVPair, error) {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	p, _, err := b.kv.Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	return p, permissionErr(err)
}

// deleteCAS deletes key if its ModifyIndex is index, and returns
// errCASFailed if it is not.
func (b *Backend) deleteCAS(ctx context.Context, key string, index uint64) error {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	ok, _, err := b.kv.DeleteCAS(&api.KVPair{Key: key, ModifyIndex: index}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return permissionErr(err)
	}
	if !ok {
		return errCASFailed
	}
	return nil
}

// errCASFailed is deleteCAS's error when the key had another index.
var errCASFailed = errors.New("consul: key changed since it was read")

// campaignErr turns err into Campaign's error: ctx.Err() once ctx ended,
// baton.ErrClosed once the Backend is closed, ErrKeyConflict and
// ErrPermissionDenied as they are, and otherwise an error wrapping
// baton.ErrBackendUnavailable (with why the session ended, if it did).
func (b *Backend) campaignErr(ctx context.Context, s *session, name, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return baton.ErrClosed
	}
	if errors.Is(err, ErrPermissionDenied) || errors.Is(err, ErrKeyConflict) {
		return fmt.Errorf("lease %q: %s: %w", name, what, err)
	}
	if serr := s.Err(); serr != nil {
		err = serr
	}
	return fmt.Errorf("%w: lease %q: %s: %w", baton.ErrBackendUnavailable, name, what, err)
}

func (b *Backend) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ttlErr *SessionTTLError
	if errors.Is(err, ErrPermissionDenied) || errors.As(err, &ttlErr) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", baton.ErrBackendUnavailable, what, err)
}

// held is a lease this Backend holds.
type held struct {
	name, key string
	index     uint64 // the lock key's ModifyIndex as the term locked it
	token     uint64
	sl        *renew.Slot
	s         *session
	sub       *sub
	term      *backend.BasicTerm
	ctx       context.Context
	stop      context.CancelFunc // stops watching the key

	mu       sync.Mutex // serialises letting go of the lock
	let      bool       // the lock is gone
	finished bool       // the name was freed
}

// hold starts the term won with token, locking key at index. sb is the
// campaign's subscription to the key, or nil; hold takes it over.
func (b *Backend) hold(s *session, sl *renew.Slot, name, key string, index, token uint64, sb *sub) (baton.Term, error) {
	ctx, stop := context.WithCancel(s.ctx)
	h := &held{name: name, key: key, index: index, token: token, sl: sl, s: s, ctx: ctx, stop: stop}
	// b.mu and the session's lock together make registering the term and
	// starting its watcher atomic with respect to Close and to the session
	// ending: either they see the term and end it, or we see them and give
	// up.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		stop()
		b.w.unsubscribe(sb)
		return nil, baton.ErrClosed // Close destroys the session, which releases our lock
	}
	t, ok := s.Start(name, token, func(ctx context.Context) error { return b.release(ctx, h) })
	if !ok {
		// The lock goes with the session, which ends now if it has not yet.
		stop()
		b.w.unsubscribe(sb)
		return nil, fmt.Errorf("%w: lease %q: consul session %s ended as the lease was won", baton.ErrBackendUnavailable, name, s.id)
	}
	if sb == nil {
		sb = b.w.subscribe(key) // not nil: the watcher closes only after b.closed is set
	} else {
		b.w.rebase(sb)
	}
	h.term, h.sub = t, sb
	b.slots.WonUntilGoneLocked(sl, t)
	b.helds[h] = struct{}{}
	b.wg.Add(1)
	go b.watchHeld(h)
	b.log.Debug("acquired", "lease", name, "token", token, "session", s.id)
	return &term{BasicTerm: t, b: b, h: h, state: strings.TrimSuffix(key, lockKey) + stateKey}, nil
}

// watchHeld ends h's term when its key stops being this term's lock. It
// returns when h.ctx ends: the term was released, or the session ended.
func (b *Backend) watchHeld(h *held) {
	defer b.wg.Done()
	defer func() {
		b.w.unsubscribe(h.sub)
		b.forget(h)
		if h.s.ctx.Err() != nil {
			b.finish(h) // the lock went with the session
		}
	}()
	var after uint64
	for {
		st, _, err := b.w.next(h.ctx, h.sub, after, 0, nil)
		if err != nil {
			return
		}
		after = st.seq
		if st.err != nil {
			continue // the renewals' safe-until bounds how long we can be blind
		}
		var why string
		switch p := st.pair; {
		case p != nil && p.ModifyIndex < h.index:
			continue // an answer from before we won
		case p != nil && p.ModifyIndex == h.index && p.Session == h.s.id:
			continue
		case p == nil && !st.current:
			continue // may be from before we won
		case p == nil:
			why = "was deleted"
		case p.Session == "":
			why = "was released (its session was invalidated or destroyed)"
		case p.Session != h.s.id:
			why = "is locked by session " + p.Session
		default:
			why = "was overwritten while locked (a plain write keeps the lock but changes its index)"
		}
		b.lost(h, why)
		return
	}
}

// lost ends h's term with baton.ErrLeaseLost and lets go of whatever of
// the key is still ours.
func (b *Backend) lost(h *held, why string) {
	h.s.Forget(h.term)
	if h.term.End(fmt.Errorf("%w: lease %q: lock key %s %s", baton.ErrLeaseLost, h.name, h.key, why)) {
		b.log.Info("lease lost", "lease", h.name, "token", h.token, "why", why)
	}
	ctx, cancel := context.WithTimeout(h.s.ctx, b.reqTimeout)
	err := b.letGo(ctx, h)
	cancel()
	if err != nil {
		b.cleanLater(h)
	}
}

func (b *Backend) forget(h *held) {
	b.mu.Lock()
	delete(b.helds, h)
	b.mu.Unlock()
}

// finish frees h's lease name for new campaigns, once h's lock is gone.
func (b *Backend) finish(h *held) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b.finishLocked(h)
}

func (b *Backend) finishLocked(h *held) {
	if h.finished {
		return
	}
	h.finished = true
	b.slots.Gone(h.sl)
}

// release is the term's release function: it deletes h's key if the key is
// still this term's lock, which wakes every waiter's blocking query.
func (b *Backend) release(ctx context.Context, h *held) error {
	h.stop()
	h.s.Forget(h.term)
	b.forget(h)
	if err := b.letGo(ctx, h); err != nil {
		// Our session keeps the lock: left alone, it would block every
		// other candidate for as long as this Backend lives.
		b.cleanLater(h)
		return fmt.Errorf("%w: release lease %q (retrying in the background): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	b.log.Debug("released", "lease", h.name, "token", h.token)
	return nil
}

// letGo removes this term's lock on h.key, once, and then frees the name:
// it deletes the key if it is still the version the term locked, or, if a
// plain write changed the key while our session kept it locked, that
// version. Deleting rather than releasing (as api.Lock.Unlock does) also
// cleans the key up, as `consul lock` does after unlocking; and an explicit
// delete, unlike a destroyed session, incurs no lock-delay. The name stays
// claimed until then, so that a lock of our session on the key can only be
// this term's. Once the session has ended there is nothing to do: the lock
// went with it (or goes when the session is destroyed or expires), and a
// new session never mistakes it for its own.
func (b *Backend) letGo(ctx context.Context, h *held) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.let {
		return nil
	}
	err := b.deleteLock(ctx, h)
	if err != nil && h.s.ctx.Err() == nil {
		return err
	}
	h.let = true
	b.finishLocked(h)
	return nil
}

func (b *Backend) deleteLock(ctx context.Context, h *held) error {
	// Once the session has ended there is nothing left to delete (see
	// letGo): stop waiting then, so that Close, which lets go of its terms'
	// locks before it ends their session, waits at most until the
	// session's safe-until for an agent that does not answer.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(h.s.ctx, cancel)()
	index := h.index
	for range 3 {
		// deleteCAS and get bound each request by reqTimeout, like every
		// other request of the Backend: ctx may have no deadline (Resign or
		// Close with context.Background()), and a request to an agent that
		// vanished would otherwise hang for as long as TCP takes to give
		// up, holding h.mu, and with it Close.
		err := b.deleteCAS(ctx, h.key, index)
		if !errors.Is(err, errCASFailed) {
			return err // nil: deleted
		}
		p, err := b.get(ctx, h.key)
		if err != nil {
			return err
		}
		if p == nil || p.Session != h.s.id || p.ModifyIndex < h.index {
			return nil // gone, or no longer ours
		}
		index = p.ModifyIndex
	}
	return fmt.Errorf("consul: lock key %s keeps changing under our session", h.key)
}

// cleanLater retries letGo every RenewInterval until it succeeds or the
// session ends (which releases the lock too).
func (b *Backend) cleanLater(h *held) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return // Close lets go of the lock, or destroys the session
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		for {
			select {
			case <-h.s.ctx.Done():
				b.finish(h)
				return
			case <-time.After(b.cfg.RenewInterval):
			}
			ctx, cancel := context.WithTimeout(h.s.ctx, b.reqTimeout)
			err := b.letGo(ctx, h)
			cancel()
			if err == nil {
				b.log.Info("let go of a leftover lock", "lease", h.name, "key", h.key)
				return
			}
			b.log.Debug("leftover lock not let go yet", "lease", h.name, "key", h.key, "err", err)
		}
	}()
}

// Leader implements baton.Backend with a consistent read of the lease's
// key. Record.Holder is the candidate ID a baton holder stored as the key's
// value; a holder that stored none (`consul lock` does not) is described
// by its session: "NAME (consul session ID on node NODE)". Record.Token is
// the holder's token: the lease's epoch<<32 + the key's ModifyIndex. Record.Since is
// always zero: Consul keeps no times.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	key, err := b.Key(name)
	if err != nil {
		return baton.Record{}, err
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return baton.Record{}, baton.ErrClosed
	}
	p, err := b.get(ctx, key)
	if err != nil {
		return baton.Record{}, b.unavailable(ctx, "read "+key, err)
	}
	if p != nil && p.Flags != api.LockFlagValue {
		return baton.Record{}, fmt.Errorf("lease %q: %w", name, conflictErr(key, p.Flags))
	}
	if p == nil || p.Session == "" {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	// Read after the lock key, so an epoch written meanwhile (Consul lost
	// its data in between) makes the token too high, never too low. None:
	// a `consul lock` holder where baton never campaigned, with the bare
	// index.
	ekey := epochKey(key)
	ep, err := b.get(ctx, ekey)
	if err != nil {
		return baton.Record{}, b.unavailable(ctx, "read "+ekey, err)
	}
	e, err := b.sawEpoch(name, ep)
	if err != nil {
		return baton.Record{}, err
	}
	holder := string(p.Value)
	if holder == "" {
		holder = b.describeSession(ctx, p.Session)
	}
	return baton.Record{Lease: name, Holder: holder, Token: epoch.Token(e, p.ModifyIndex)}, nil
}

// describeSession names the holder of a lock that carries no candidate ID.
func (b *Backend) describeSession(ctx context.Context, id string) string {
	ctx, cancel := context.WithTimeout(ctx, b.reqTimeout)
	defer cancel()
	info, _, err := b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || info == nil {
		return "consul session " + id
	}
	return fmt.Sprintf("%s (consul session %s on node %s)", info.Name, id, info.Node)
}

// Close ends every term this Backend holds (Err wraps baton.ErrClosed),
// deletes their keys and destroys its session, so that standbys take over
// at once, and waits for the goroutines it started. The keys are deleted
// before the session is destroyed because Consul applies the session's
// lock-delay to the keys a destroyed session held, but not to deleted
// ones. ctx bounds those requests; if they fail, the locks go when Consul
// invalidates the session, after twice its TTL, and Close returns the
// error. Each request is also bounded by the Backend's request timeout
// (the session TTL, at least 5 s), and deleting a key is given up once the
// session's safe-until has passed, so that Close returns even with a ctx
// without deadline when the agent has stopped answering. The client stays
// usable. Later calls of Campaign and Leader return baton.ErrClosed; a
// second Close returns nil.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.wg.Wait()
		return nil
	}
	b.closed = true
	s := b.sess
	b.sess = nil
	var helds []*held
	for h := range b.helds {
		if h.s == s {
			helds = append(helds, h)
		}
	}
	b.mu.Unlock()
	b.w.close()
	var errs []error
	if s != nil {
		s.End(fmt.Errorf("%w: consul session %s closed", baton.ErrClosed, s.id))
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			sem = make(chan struct{}, 8)
		)
		for _, h := range helds {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if err := b.letGo(ctx, h); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("delete %s: %w", h.key, err))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		s.cancel()
		// Bounded like every other request, should ctx have no deadline.
		dctx, dcancel := context.WithTimeout(ctx, b.reqTimeout)
		_, err := b.client.Session().Destroy(s.id, (&api.WriteOptions{}).WithContext(dctx))
		dcancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("destroy session %s (it expires after twice its TTL, %s): %w", s.id, 2*s.ttl, err))
		}
	}
	b.cancel()
	b.wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("consul: close: %w", errors.Join(errs...))
	}
	return nil
}
