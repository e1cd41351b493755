package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/epoch"
	"github.com/batonhq/baton/internal/renew"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Options configures a Backend. The zero value means the documented defaults.
type Options struct {
	backend.
		// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s, TTL/3,
		// TTL/10). etcd grants TTLs in whole seconds, so TTL is rounded up to the
		// next second when the session is granted; RenewInterval and DriftMargin
		// are used as given.
		Config

	// Prefix is put in front of every lease name to make the etcd election
	// name, as in concurrency.NewElection(session, Prefix+name); include a
	// trailing "/" if you want one. Empty (the default) means the lease name
	// is the election name, so that `etcdctl elect --listen NAME` finds it;
	// set it (say to "baton/") to keep baton's keys apart in a shared etcd.
	Prefix string

	// Logger receives log lines (group "etcd"). Nil (the default) means
	// silent.
	Logger *slog.Logger
}

// Backend runs baton leases on etcd over one session lease per Backend. It is
// safe for concurrent use. One Backend stands for one process; it may hold any
// number of leases.
type Backend struct {
	client *clientv3.Client
	cfg    backend.Config
	ttlSec int64 // Config.TTL rounded up to whole seconds, as etcd grants them
	prefix string
	log    *slog.Logger

	// ctx bounds the Backend's background work; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// granting admits one caller at a time to create the session, so that a
	// burst of first campaigns shares one lease instead of granting many; it
	// is a channel so that waiting honours the caller's ctx.
	granting chan struct{}

	mu     sync.Mutex
	closed bool
	sess   *session // nil before the first campaign and after a session ended
	// slots, guarded by mu, marks the lease names this Backend campaigns
	// for or holds. The key of a name is derived from the session alone,
	// so two campaigns for one name over one session would share a key: a
	// slot keeps them apart. While a key whose creation may or may not have
	// landed is being deleted in the background, the name stays claimed, so
	// that the clean-up cannot delete a new campaign's key.
	slots *renew.Slots

	// epochs follows the epoch keys this Backend reads, so that an epoch
	// it writes after etcd lost its data is above the old one, and the
	// loss is logged.
	epochs epoch.Tracker
	// now is the wall clock an epoch written is taken from.
	now func() time.Time
}

var _ baton.Backend = (*Backend)(nil)

// New returns a Backend that campaigns through client. The client remains the
// caller's: Close does not close it.
func New(client *clientv3.Client, opts Options) (*Backend, error) {
	cfg, err := opts.Config.WithDefaults()
	if err != nil {
		return nil, err
	}
	if client == nil {
		return nil, &baton.ConfigError{Problems: []string{"etcd: client is nil: pass a *clientv3.Client from clientv3.New"}}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		client:   client,
		cfg:      cfg,
		ttlSec:   int64((cfg.TTL + time.Second - 1) / time.Second),
		prefix:   opts.Prefix,
		log:      log.WithGroup("etcd"),
		ctx:      ctx,
		cancel:   cancel,
		granting: make(chan struct{}, 1),
		now:      time.Now,
	}
	b.slots = renew.NewSlots(&b.mu, func() bool { return b.closed }, "etcd")
	return b, nil
}

// Config returns the timing the Backend uses, defaults filled in. TTL is as
// configured; the session's TTL is that rounded up to whole seconds, or more
// if etcd raised it.
func (b *Backend) Config() backend.Config { return b.cfg }

func checkName(name string) error {
	if name == "" {
		return errors.New("etcd: lease name must not be empty")
	}
	if strings.Contains(name, "/") {
		return fmt.Errorf("etcd: lease name %q must not contain \"/\": its keys would fall under election %q too, and the two would contend; put shared path segments in Options.Prefix",
			name, name[:strings.IndexByte(name, '/')])
	}
	return nil
}

// Campaign implements baton.Backend. A second Campaign for a name this
// Backend already campaigns for or holds returns an error wrapping
// baton.ErrAlreadyCampaigning, whatever the candidate: the campaign's key is
// derived from the Backend's session, not from the candidate.
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if c.ID == "" {
		return nil, fmt.Errorf("etcd: candidate ID must not be empty (lease %q)", name)
	}
	return b.slots.Campaign(ctx, name, c.ID, func(sl *renew.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

func (b *Backend) campaign(ctx context.Context, sl *renew.Slot, name, id string) (baton.Term, error) {
	pfx := b.prefix + name + "/"
	var (
		s   *session
		key string
		rev int64
		ep  uint64
	)
	for retried := false; ; retried = true {
		var err error
		if s, err = b.session(ctx); err != nil {
			return nil, err
		}
		key = fmt.Sprintf("%s%x", pfx, s.id) // concurrency.Election's layout
		rev, ep, err = b.createKey(ctx, s, name, key, id)
		if err == nil {
			break
		}
		if isLeaseNotFound(err) && !retried {
			// etcd dropped the session before our keep-alive noticed: the
			// put did not happen, and a new session will do.
			b.endSession(s, b.lostErr(s))
			continue
		}
		// The put may have landed though its reply was lost. A key left
		// behind would queue up and some day make us leader unknowingly.
		b.dropKey(s, sl, name, key, 0)
		return nil, b.campaignErr(ctx, s, name, "create election key "+key, err)
	}
	b.log.Debug("campaigning", "lease", name, "key", key, "rev", rev)
	for {
		// Read our key and our predecessor at one revision: a key deleted
		// while we waited (by an operator, say) must not become leader.
		resp, err := b.client.Txn(ctx).Then(
			clientv3.OpGet(key),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...),
		).Commit()
		if err != nil {
			b.dropKey(s, sl, name, key, rev)
			return nil, b.campaignErr(ctx, s, name, "read election "+pfx, err)
		}
		own := resp.Responses[0].GetResponseRange().Kvs
		if len(own) == 0 || own[0].CreateRevision != rev {
			if err := s.Err(); err != nil {
				return nil, b.campaignErr(ctx, s, name, "wait", err)
			}
			return nil, fmt.Errorf("%w: election key %s was deleted while waiting for lease %q", baton.ErrLeaseLost, key, name)
		}
		prev := resp.Responses[1].GetResponseRange().Kvs
		if len(prev) == 0 {
			return b.hold(s, sl, name, key, rev, ep, resp.Header.Revision)
		}
		if err := b.waitDelete(ctx, s, string(prev[0].Key), resp.Header.Revision+1); err != nil {
			if ctx.Err() != nil {
				b.dropKey(s, sl, name, key, rev)
			}
			return nil, b.campaignErr(ctx, s, name, "wait for "+string(prev[0].Key), err)
		}
	}
}

// createKey puts our key unless it exists, and returns its create revision
// and the lease's epoch, read in the same transaction: a key and an epoch
// from one incarnation of etcd's data.
func (b *Backend) createKey(ctx context.Context, s *session, name, key, id string) (int64, uint64, error) {
	ekey := b.epochKey(name)
	for range 4 {
		resp, err := b.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(ekey), ">", 0)).
			Then(clientv3.OpPut(key, id, clientv3.WithLease(s.id)), clientv3.OpGet(ekey)).
			Else(clientv3.OpGet(key), clientv3.OpGet(ekey)).
			Commit()
		if err != nil {
			return 0, 0, err
		}
		ekvs := resp.Responses[1].GetResponseRange().Kvs
		if resp.Succeeded {
			e, err := b.sawEpoch(name, ekvs)
			if err != nil {
				// The key is ours, with a token nobody can compute.
				_ = b.deleteKey(ctx, key, resp.Header.Revision)
				return 0, 0, err
			}
			return resp.Header.Revision, e, nil
		}
		if len(ekvs) == 0 {
			if err := b.createEpoch(ctx, name); err != nil {
				return 0, 0, err
			}
			continue
		}
		// Our session already has a key here: one whose release failed, or
		// whose term a concurrent Resign is still releasing. Adopting it
		// would reuse an old term's token, so delete it and start afresh.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		b.log.Debug("replacing a leftover key", "key", key, "rev", kvs[0].CreateRevision)
		if err := b.deleteKey(ctx, key, kvs[0].CreateRevision); err != nil {
			return 0, 0, err
		}
	}
	return 0, 0, fmt.Errorf("key %s keeps reappearing, or epoch key %s keeps vanishing", key, ekey)
}

// waitDelete returns nil once key may have been deleted after revision from
// (the caller reads again to find out), or an error when ctx or the session
// ends first.
func (b *Backend) waitDelete(ctx context.Context, s *session, key string, from int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	for wr := range b.client.Watch(wctx, key, clientv3.WithRev(from)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
		if wr.Err() != nil {
			return nil // compacted, say: read again and watch from there
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.Err(); err != nil {
		return err
	}
	// The client is closing; the caller's next read reports it.
	return nil
}

// campaignErr turns err into Campaign's error (see renew.CampaignErr).
func (b *Backend) campaignErr(ctx context.Context, s *session, name, what string, err error) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	return renew.CampaignErr(ctx, closed, s.Terms, name, what, err)
}

func (b *Backend) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %w", baton.ErrBackendUnavailable, what, err)
}

// held is a lease this Backend holds.
type held struct {
	name, key string
	rev       int64
	sl        *renew.Slot
	s         *session
	term      *backend.BasicTerm
	stop      context.CancelFunc // stops watching the key
}

// hold starts the term won at revision at.
func (b *Backend) hold(s *session, sl *renew.Slot, name, key string, rev int64, ep uint64, at int64) (baton.Term, error) {
	ctx, stop := context.WithCancel(s.ctx)
	h := &held{name: name, key: key, rev: rev, sl: sl, s: s, stop: stop}
	// b.mu and the session's lock together make registering the term and starting its
	// watcher atomic with respect to Close and to the session ending: either
	// they see the term and end it, or we see them and give up.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		stop()
		return nil, baton.ErrClosed // Close revokes the session, and our key with it
	}
	token := epoch.Token(ep, uint64(rev))
	t, ok := s.Start(name, token, func(ctx context.Context) error {
		return b.release(ctx, h)
	})
	if !ok {
		// Our key goes with the session, which ends now if it has not yet.
		stop()
		return nil, fmt.Errorf("%w: lease %q: etcd session %x ended as the lease was won", baton.ErrBackendUnavailable, name, s.id)
	}
	h.term = t
	b.slots.WonLocked(sl, h.term)
	b.wg.Add(1)
	go b.watchHeld(ctx, h, at+1)
	b.log.Debug("acquired", "lease", name, "token", token, "rev", rev, "session", fmt.Sprintf("%x", s.id))
	return &stateTerm{BasicTerm: h.term, b: b, h: h}, nil
}

// watchHeld ends h's term when its key is deleted after revision from. It
// returns when ctx ends: the term was released, or the session ended.
func (b *Backend) watchHeld(ctx context.Context, h *held, from int64) {
	defer b.wg.Done()
	defer b.slots.Unclaim(h.sl)
	defer h.stop()
	lost := func(why string) {
		h.s.Forget(h.term)
		if h.term.End(fmt.Errorf("%w: lease %q: election key %s %s", baton.ErrLeaseLost, h.name, h.key, why)) {
			b.log.Info("lease lost", "lease", h.name, "token", h.rev, "why", why)
		}
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		for wr := range b.client.Watch(wctx, h.key, clientv3.WithRev(from)) {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != h.rev {
					cancel()
					lost("was deleted (by an operator, or by etcd expiring the session)")
					return
				}
			}
			if wr.Err() != nil {
				break
			}
			from = wr.Header.Revision + 1
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		// The watch ended without a verdict (compaction, or the client is
		// closing): look at the key itself before watching again.
		resp, err := b.client.Get(ctx, h.key)
		if err != nil {
			// The session's safe-until bounds how long this can go on.
			select {
			case <-ctx.Done():
			case <-time.After(b.cfg.RenewInterval / 4):
			}
			continue
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
			lost("is gone")
			return
		}
		from = resp.Header.Revision + 1
	}
}

// release is the term's release function: it deletes h's key if the key is
// still the one this term created.
func (b *Backend) release(ctx context.Context, h *held) error {
	h.stop()
	h.s.Forget(h.term)
	err := b.deleteKey(ctx, h.key, h.rev)
	if err != nil {
		// Our session keeps the key alive: left alone, it would block every
		// other candidate for as long as this Backend lives.
		b.cleanLater(h.s, h.sl, h.name, h.key, h.rev)
		return fmt.Errorf("%w: release lease %q (retrying in the background): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	b.log.Debug("released", "lease", h.name, "token", h.rev)
	b.slots.Unclaim(h.sl)
	return nil
}

// deleteKey deletes key if its create revision is rev; rev 0 means whatever
// is there, which only a campaign holding the name's slot may ask for.
func (b *Backend) deleteKey(ctx context.Context, key string, rev int64) error {
	if rev == 0 {
		resp, err := b.client.Get(ctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		rev = resp.Kvs[0].CreateRevision
	}
	_, err := b.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err
}

// dropKey deletes a campaign's key once, bounded by RenewInterval, and keeps
// trying in the background if that fails. The caller's context may have
// ended already, which is often why the key must go.
func (b *Backend) dropKey(s *session, sl *renew.Slot, name, key string, rev int64) {
	if s.ctx.Err() != nil {
		return // the key went, or goes, with the session
	}
	ctx, cancel := context.WithTimeout(s.ctx, b.cfg.RenewInterval)
	err := b.deleteKey(ctx, key, rev)
	cancel()
	if err != nil {
		b.log.Warn("could not delete an abandoned campaign's key; retrying in the background", "lease", name, "key", key, "err", err)
		b.cleanLater(s, sl, name, key, rev)
	}
}

// cleanLater retries deleteKey every RenewInterval until it succeeds or the
// session ends (which deletes the key too). While it runs it keeps sl, if sl
// is still the name's slot, so that no new campaign's key can be mistaken
// for the old one.
func (b *Backend) cleanLater(s *session, sl *renew.Slot, name, key string, rev int64) {
	b.mu.Lock()
	if b.closed || s.ctx.Err() != nil {
		b.mu.Unlock()
		return
	}
	done, _ := b.slots.CleaningLocked(sl)
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
			ctx, cancel := context.WithTimeout(s.ctx, b.cfg.RenewInterval)
			err := b.deleteKey(ctx, key, rev)
			cancel()
			if err == nil {
				b.log.Info("deleted a leftover election key", "lease", name, "key", key)
				return
			}
			b.log.Debug("leftover election key not deleted yet", "lease", name, "key", key, "err", err)
		}
	}()
}

// Leader implements baton.Backend. It reports the candidate with the oldest
// key, which right after a holder stopped at its safe-until may still be that
// holder, until etcd expires its session, and the token its term has (read
// with the lease's epoch in one transaction). Record.Since is always zero:
// etcd keeps no times.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	if err := checkName(name); err != nil {
		return baton.Record{}, err
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return baton.Record{}, baton.ErrClosed
	}
	resp, err := b.client.Txn(ctx).Then(
		clientv3.OpGet(b.prefix+name+"/", clientv3.WithFirstCreate()...),
		clientv3.OpGet(b.epochKey(name)),
	).Commit()
	if err != nil {
		return baton.Record{}, b.unavailable(ctx, "read election "+b.prefix+name+"/", err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	var e uint64
	if ekvs := resp.Responses[1].GetResponseRange().Kvs; len(ekvs) > 0 {
		// No epoch key: a holder outside baton (etcdctl elect) on an etcd
		// where baton never campaigned for the lease; its token is the bare
		// revision.
		if e, err = b.sawEpoch(name, ekvs); err != nil {
			return baton.Record{}, err
		}
	}
	kv := kvs[0]
	return baton.Record{Lease: name, Holder: string(kv.Value), Token: epoch.Token(e, uint64(kv.CreateRevision))}, nil
}

// Close ends every term this Backend holds (Err wraps baton.ErrClosed),
// revokes its session so that standbys take over at once, and waits for the
// goroutines it started. ctx bounds the revoke; if that fails, the keys
// expire after the TTL and Close returns the error. The client stays open.
// Later calls of Campaign and Leader return baton.ErrClosed; a second Close
// returns nil.
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
	b.mu.Unlock()
	var err error
	if s != nil {
		b.endSession(s, fmt.Errorf("%w: etcd session %x closed", baton.ErrClosed, s.id))
		if _, rerr := b.client.Revoke(ctx, s.id); rerr != nil && !isLeaseNotFound(rerr) {
			err = fmt.Errorf("etcd: revoke session lease %x (its keys expire after the TTL): %w", s.id, rerr)
		}
	}
	b.cancel()
	b.wg.Wait()
	return err
}
