package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/consul/api"
)

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
	// turns holds a token for each request in flight that is bounded by
	// Options.MaxRequests (see turn).
	turns chan struct{}
	// readEach is set once the servers turned out not to know the
	// transaction verb get-or-empty (Consul before 1.14): Leaders then
	// reads one lease a request, as Leader does.
	readEach atomic.Bool
	log      *slog.Logger

	// sessions owns the session, the goroutines and the lease names this
	// Backend campaigns for or holds. The key of a name is the same for
	// every campaign of this Backend's session, so two campaigns for one
	// name must not overlap; nor may a new campaign start before an ended
	// term's lock is gone (see finish), or the clean-up of the old term
	// could delete the new term's lock. While a lock that a failed
	// campaign's transaction may have taken is being let go in the
	// background, the name stays claimed, so that the clean-up cannot
	// delete a new campaign's lock.
	sessions *backend.SessionManager[string]

	w *watcher

	// hmu guards helds, the terms whose locks Close lets go of. It is
	// taken after the sessions' mutex when both are held.
	hmu   sync.Mutex
	helds map[*held]struct{}

	// tmu guards tombs: by session ID, the released keys that campaigns'
	// clean-ups put where a write of that session whose answer was lost
	// might still land (see cleanUp). Once the session is gone no such
	// write can land, and Revoke deletes them.
	tmu   sync.Mutex
	tombs map[string][]string

	// epochs follows the epoch keys as read (see epochKey).
	epochs backend.EpochTracker
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
	cfg, sessTTL, lockDelay, prefix, problems, err := opts.settle()
	if err != nil {
		return nil, err
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
		turns:         make(chan struct{}, cmp.Or(opts.MaxRequests, DefaultMaxRequests)),
		log:           log,
		helds:         map[*held]struct{}{},
		tombs:         map[string][]string{},
	}
	b.sessions = newSessions(b)
	b.w = newWatcher(b.sessions.Context(), b.kv, watchWait, log)
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
	if b.sessions.Closed() {
		return baton.Record{}, baton.ErrClosed
	}
	p, err := b.get(ctx, key)
	if err != nil {
		return baton.Record{}, b.unavailable(ctx, "read "+key, err)
	}
	return b.recordOf(ctx, name, key, p)
}

// recordOf is Leader's answer when the lease's key (at key) is p, or
// absent (nil).
func (b *Backend) recordOf(ctx context.Context, name, key string, p *api.KVPair) (baton.Record, error) {
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
	return b.recordWith(ctx, name, key, p, ep)
}

// recordWith is Leader's answer for lease name from its lock key's pair p
// and its epoch key's pair ep (each nil when absent), read at the same
// index or ep after p.
func (b *Backend) recordWith(ctx context.Context, name, key string, p, ep *api.KVPair) (baton.Record, error) {
	if p != nil && p.Flags != api.LockFlagValue {
		return baton.Record{}, fmt.Errorf("lease %q: %w", name, conflictErr(key, p.Flags))
	}
	if p == nil || p.Session == "" {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	e, err := b.sawEpoch(name, ep)
	if err != nil {
		return baton.Record{}, err
	}
	holder := string(p.Value)
	if holder == "" {
		holder = b.describeSession(ctx, p.Session)
	}
	return baton.Record{Lease: name, Holder: holder, Token: backend.EpochToken(e, p.ModifyIndex)}, nil
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
	err := b.sessions.Close(ctx, func(s *sess) error {
		b.w.close()
		if s == nil {
			return nil
		}
		return b.letGoAll(ctx, s)
	})
	b.w.done()
	if err != nil {
		return fmt.Errorf("consul: close: %w", err)
	}
	return nil
}

// letGoAll lets go of the locks of the terms on s, eight at a time.
func (b *Backend) letGoAll(ctx context.Context, s *sess) error {
	b.hmu.Lock()
	var helds []*held
	for h := range b.helds {
		if h.s == s {
			helds = append(helds, h)
		}
	}
	b.hmu.Unlock()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 8)
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
	return errors.Join(errs...)
}
