package raft

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// Options configures a Backend. The zero value means the documented
// defaults.
type Options struct {
	backend.
		// Config holds TTL, RenewInterval and DriftMargin (defaults:
		// DefaultTTL, TTL/3, TTL/10). TTL is the session's: how long after this
		// process's last confirmed renewal the raft leader expires its leases.
		// New refuses timing whose renewal window is below the member's
		// heartbeat timeout (CheckTiming; MinTTL, 2.21 s at the defaults).
		Config

	// StaleReads makes Leader read the nearest copy of the log instead of
	// asking the raft leader: faster and available without a quorum, but
	// it may report a holder that has since changed. Default false
	// (linearizable).
	StaleReads bool

	// Logger receives log lines (group "raft"). Nil (the default) means
	// silent.
	Logger *slog.Logger
}

// Backend runs baton leases on a raft group, over one session per Backend.
// It is safe for concurrent use and may hold any number of leases.
type Backend struct {
	g     Group
	cfg   backend.Config
	stale bool
	log   *slog.Logger

	// sessions owns the session, the goroutines and the lease names this
	// Backend campaigns for or holds: one session has one place per lease.
	sessions *backend.SessionManager[string]

	// mu guards orphans, unreleased and reaping. It is taken before the
	// sessions' mutex when both are held.
	mu      sync.Mutex
	orphans map[string]string // lease -> session: a queue place or a hold nobody waits for
	// unreleased holds the terms whose release failed (lease -> its
	// session and token): the log gives each lease to this session until
	// a release at that token lands, which reap retries.
	unreleased map[string]unreleasedTerm
	reaping    bool
	// keepUnreleased, set by tests before the first campaign, leaves a
	// failed release to the next campaign instead of retrying it.
	keepUnreleased bool

	// epochs follows the group's epoch (the high half of the tokens), to
	// report a group re-created under an agent client.
	epochs backend.EpochTracker

	// heldMu guards held: the highest token this Backend held for each
	// lease, which a campaign tells the group (see sawHeld).
	heldMu sync.Mutex
	held   map[string]uint64

	// watch, on a member, ends held terms that the member's copy of the
	// log gives to another term, all of them with one subscription; nil
	// on an agent client, where agentWatch does, with one long-poll of
	// the agent.
	watch      *heldWatch
	agentWatch *agentWatch
}

var _ baton.Backend = (*Backend)(nil)

// DefaultTTL is the session TTL when Options.TTL is zero. It is shorter
// than backend.DefaultTTL: the raft leader times sessions itself, so the TTL
// bounds failover without standing in for a remote server's slack, and a
// crash of any member is over within about one TTL, plus half a heartbeat
// timeout when it was the raft leader. It is long enough that a holder
// rides out a stall of its member or of the raft leader of a second or
// more, and a raft election after a crash of the raft leader, without a
// renewal going unconfirmed past its safe-until (see docs/guarantees.md
// for the figures).
const DefaultTTL = 5 * time.Second

// timing returns o's TTL, RenewInterval and DriftMargin, defaults applied.
func (o Options) timing() (backend.Config, error) {
	c := o.Config
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	return c.WithDefaults()
}

// New returns a Backend that campaigns through g, a member (StartNode) or
// an agent client (Dial). g remains the caller's: Close does not close it.
func New(g Group, opts Options) (*Backend, error) {
	cfg, err := opts.timing()
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, &baton.ConfigError{Problems: []string{"raft: group is nil: pass a *Node from StartNode or a *Client from Dial"}}
	}
	if n, ok := g.(*Node); ok {
		// An agent client's TTL is judged by the raft leader when it
		// creates the session (a *TTLError from Campaign).
		if err := CheckTiming(opts.Config, n.opts.HeartbeatTimeout); err != nil {
			return nil, err
		}
	}
	if g.witness() {
		return nil, &baton.ConfigError{Problems: []string{"raft: this member is a witness: it votes but never campaigns; run the job on the other members"}}
	}
	if n, ok := g.(*Node); ok && cfg.TTL > n.opts.MaxTTL {
		return nil, &baton.ConfigError{Problems: []string{fmt.Sprintf(
			"raft: TTL %s is above the group's longest, %s (NodeOptions.MaxTTL, --max-ttl): use a shorter TTL, or raise MaxTTL on every member (a recovery from a lost majority then holds grants that much longer)", cfg.TTL, n.opts.MaxTTL)}}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		g: g, cfg: cfg, stale: opts.StaleReads, log: log.WithGroup("raft"),
		orphans: map[string]string{}, unreleased: map[string]unreleasedTerm{},
	}
	b.sessions = newSessions(b)
	switch g := g.(type) {
	case *Node:
		b.watch = newHeldWatch(b, g.fsm)
	case *Client:
		b.agentWatch = newAgentWatch(b, g)
	}
	return b, nil
}

// Config returns the timing the Backend uses, defaults filled in.
func (b *Backend) Config() backend.Config { return b.cfg }

// Campaign implements baton.Backend. Candidates queue in the log in the
// order they asked (first come, first served); the Backend's own
// candidates for one name take turns in the process, one in the log's
// queue at a time. A second Campaign by a candidate that already
// campaigns for or holds the name returns an error wrapping
// baton.ErrAlreadyCampaigning.
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if name == "" {
		return nil, errors.New("raft: lease name must not be empty")
	}
	if c.ID == "" {
		return nil, fmt.Errorf("raft: candidate ID must not be empty (lease %q)", name)
	}
	return b.sessions.Campaign(ctx, name, c.ID, func(sl *backend.Slot) (baton.Term, error) {
		return b.campaign(ctx, sl, name, c.ID)
	})
}

func (b *Backend) campaign(ctx context.Context, sl *backend.Slot, name, id string) (baton.Term, error) {
	var (
		s   *sess
		res *result
	)
	for retried := false; ; retried = true {
		var err error
		if s, err = b.sessions.Session(ctx); err != nil {
			return nil, err
		}
		actx, cancel := s.Bound(ctx)
		res, err = b.g.apply(actx, command{Op: opAcquire, Session: s.ID, Lease: name, Candidate: id, Time: wallNow(b.g), Token: b.heldToken(name)})
		cancel()
		if err != nil {
			// The acquire may have landed though its reply was lost.
			b.abandon(name, s)
			return nil, b.campaignErr(ctx, s, name, "acquire", err)
		}
		if res.Err == errUnknownSession && !retried {
			b.sessions.Lost(s)
			continue
		}
		if res.Err != "" {
			return nil, fmt.Errorf("%w: lease %q: acquire refused: %s", baton.ErrBackendUnavailable, name, res.Err)
		}
		break
	}
	if res.Holder && res.Token != 0 && res.Token == b.heldToken(name) {
		// The log still gives the lease to this session at a token a term
		// of this Backend held and ended: its release did not land. That
		// token must not serve a second term (a late write of the first
		// would pass a fence meant for the second): give the lease back,
		// and campaign anew for a token of its own.
		if t := b.sessions.Term(name); t != nil && t.Err() == nil && t.Token() == res.Token {
			return nil, fmt.Errorf("%w: lease %q is held by a live term of this Backend", baton.ErrAlreadyCampaigning, name)
		}
		b.log.Info("the lease was still held for a term of this process that ended without its release landing; releasing it before campaigning", "lease", name, "token", res.Token)
		rctx, cancel := s.Bound(ctx)
		_, err := b.g.apply(rctx, command{Op: opRelease, Session: s.ID, Lease: name, Token: res.Token, Time: time.Now()})
		cancel()
		if err != nil {
			return nil, b.campaignErr(ctx, s, name, "release a leftover term", err)
		}
		return b.campaign(ctx, sl, name, id)
	}
	if res.Holder {
		return b.hold(s, sl, name, res.Token, res.Index, res.Prev)
	}
	b.log.Debug("queued", "lease", name, "session", s.ID, "index", res.Index)
	minIndex, after := res.Index, uint64(0)
	for {
		wctx, cancel := s.Bound(ctx)
		v, err := b.g.wait(wctx, name, s.ID, minIndex, after)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				b.abandon(name, s)
			}
			return nil, b.campaignErr(ctx, s, name, "wait", err)
		}
		switch {
		case v.Session == s.ID:
			return b.hold(s, sl, name, v.Token, v.Index, v.Prev)
		case v.SessionGone:
			b.sessions.Lost(s)
			return nil, b.campaignErr(ctx, s, name, "wait", errSessionGone)
		case !v.Waiting:
			return nil, fmt.Errorf("%w: lease %q: this candidate's place in the queue was removed", baton.ErrBackendUnavailable, name)
		}
		minIndex, after = v.Index, v.Modified
	}
}

// abandon takes this session's place for name out of the queue (or gives
// the lease back, if it was granted meanwhile), in the background until it
// succeeds or the session ends: a place left behind would some day make
// this process leader with nobody acting.
func (b *Backend) abandon(name string, s *sess) {
	// At once first, so that a candidate that gave up is out of the queue
	// when Campaign returns; in the background if the group is slow.
	ctx, cancel := s.Bound(context.Background())
	ctx, cancel2 := context.WithTimeout(ctx, min(b.cfg.RenewInterval, time.Second))
	err := b.dropPlace(ctx, name, s)
	cancel2()
	cancel()
	if err == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sessions.Closed() {
		return // Close destroys the session, and every place with it
	}
	b.orphans[name] = s.ID
	if !b.reaping {
		b.reaping = b.sessions.Go(b.reap)
	}
}

// unreleasedTerm is a term of this Backend that ended but whose release
// did not land.
type unreleasedTerm struct {
	session string
	token   uint64
}

// releaseLater retries, in the background until it lands or the session
// ends, the release of the term of name at token on s: until then the log
// gives the lease to s, and no other candidate gets it. A release names
// its token, so a late one never ends a later term.
func (b *Backend) releaseLater(name string, s *sess, token uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sessions.Closed() || b.keepUnreleased {
		return // Close destroys the session, and the hold with it (or a test keeps it)
	}
	b.unreleased[name] = unreleasedTerm{session: s.ID, token: token}
	if !b.reaping {
		b.reaping = b.sessions.Go(b.reap)
	}
}

// reap gives up, in the background, the queue places of abandoned
// campaigns (orphans) and the holds of terms whose release failed
// (unreleased), retrying each every RenewInterval/4 until it lands or its
// session ends.
func (b *Backend) reap() {
	for {
		b.mu.Lock()
		if (len(b.orphans) == 0 && len(b.unreleased) == 0) || b.sessions.Closed() {
			b.reaping = false
			b.mu.Unlock()
			return
		}
		var (
			name, sid string
			left      unreleasedTerm
			isLeft    bool
		)
		for name, left = range b.unreleased {
			sid, isLeft = left.session, true
			break
		}
		if !isLeft {
			for name, sid = range b.orphans {
				break
			}
		}
		b.mu.Unlock()
		if isLeft {
			b.retryRelease(name, left)
			continue
		}
		s := b.sessions.Live()
		if s == nil || s.ID != sid || s.Context().Err() != nil {
			b.dropOrphan(name, sid) // the session is gone, and the place with it
			continue
		}
		ctx, cancel := context.WithTimeout(s.Context(), b.cfg.TTL)
		err := b.dropPlace(ctx, name, s)
		cancel()
		if err == nil {
			b.dropOrphan(name, sid)
			continue
		}
		b.log.Debug("could not yet give up an abandoned place; retrying", "lease", name, "err", err)
		select {
		case <-s.Context().Done():
		case <-time.After(b.cfg.RenewInterval / 4):
		}
	}
}

// retryRelease sends the release of left once, and forgets left when it
// landed or its session is gone; else it waits a while before reap tries
// again.
func (b *Backend) retryRelease(name string, left unreleasedTerm) {
	forget := func() {
		b.mu.Lock()
		if b.unreleased[name] == left {
			delete(b.unreleased, name)
		}
		b.mu.Unlock()
	}
	s := b.sessions.Live()
	if s == nil || s.ID != left.session || s.Context().Err() != nil {
		forget() // the session is gone, and the hold with it
		return
	}
	ctx, cancel := context.WithTimeout(s.Context(), b.cfg.TTL)
	_, err := b.g.apply(ctx, command{Op: opRelease, Session: s.ID, Lease: name, Token: left.token, Time: time.Now()})
	cancel()
	if err == nil {
		b.log.Info("released in the background a lease whose release had failed", "lease", name, "token", left.token)
		forget()
		return
	}
	b.log.Debug("could not yet release a term that ended; retrying", "lease", name, "token", left.token, "err", err)
	select {
	case <-s.Context().Done():
	case <-time.After(b.cfg.RenewInterval / 4):
	}
}

func (b *Backend) dropOrphan(name, sid string) {
	b.mu.Lock()
	if b.orphans[name] == sid {
		delete(b.orphans, name)
	}
	b.mu.Unlock()
}

// dropPlace dequeues s from name, or releases name if s holds it and no
// live term of ours does.
func (b *Backend) dropPlace(ctx context.Context, name string, s *sess) error {
	if _, err := b.g.apply(ctx, command{Op: opDequeue, Session: s.ID, Lease: name}); err != nil {
		return err
	}
	v, err := b.g.read(ctx, name, s.ID, false)
	if err != nil {
		return err
	}
	if v.Session != s.ID {
		return nil
	}
	t := b.sessions.Term(name)
	live := t != nil && t.Err() == nil && t.Token() == v.Token
	if live {
		return nil
	}
	_, err = b.g.apply(ctx, command{Op: opRelease, Session: s.ID, Lease: name, Token: v.Token, Time: time.Now()})
	return err
}

// campaignErr turns err into Campaign's error (see
// backend.SessionManager.CampaignErr).
func (b *Backend) campaignErr(ctx context.Context, s *sess, name, what string, err error) error {
	return b.sessions.CampaignErr(ctx, s, name, what, err)
}

// held is a lease this Backend holds.
type held struct {
	name  string
	token uint64
	at    uint64 // the index of the entry that granted it
	s     *sess
	sl    *backend.Slot
	term  *backend.BasicTerm
	// stop ends watchHeld, on an agent client that long-polls per lease;
	// nil otherwise.
	stop context.CancelFunc
}

// unwatch stops watching h's lease: its term ended, or is being released.
func (b *Backend) unwatch(h *held) {
	switch {
	case b.watch != nil:
		b.watch.remove(h)
	case b.agentWatch != nil:
		b.agentWatch.remove(h) // and h.stop, under its lock
	case h.stop != nil:
		h.stop()
	}
}

// hold starts the term granted at index at with token, after prev (nil:
// unknown).
func (b *Backend) hold(s *sess, sl *backend.Slot, name string, token, at uint64, prev *prevTerm) (baton.Term, error) {
	h := &held{name: name, token: token, at: at, s: s, sl: sl}
	opts := backend.StartOptions{Started: func(t *backend.BasicTerm) { h.term = t }}
	if b.watch == nil && b.agentWatch == nil {
		ctx, stop := context.WithCancel(s.Context())
		h.stop = stop
		opts.Watch = func() { b.watchHeld(ctx, h, at) }
	}
	// If Start fails, the lease goes with the session: Close destroys it,
	// or it ends now if it has not yet.
	t, err := b.sessions.Start(s, sl, name, token, func(ctx context.Context) error { return b.release(ctx, h) }, opts)
	if err != nil {
		if h.stop != nil {
			h.stop()
		}
		return nil, err
	}
	if b.watch != nil {
		b.watch.add(h)
	}
	if b.agentWatch != nil {
		b.agentWatch.add(h)
	}
	b.log.Debug("acquired", "lease", name, "token", token, "session", s.ID)
	if e := token >> 32; e != 0 {
		// The group's epoch, as the high half of a token of this lease.
		b.epochs.Report(b.log, backend.EpochLocation{Store: "the raft group", Counter: "log indexes", Kind: "lease", Key: name}, e)
	}
	b.sawHeld(name, token)
	if prev != nil && prev.First {
		prev = &firstTerm // the same for every first term: not a copy per lease
	}
	return &term{BasicTerm: t, b: b, h: h, prev: prev}, nil
}

// firstTerm is the predecessor of a lease's first term.
var firstTerm = prevTerm{First: true}

// term is a raft Backend's baton.Term. Its state lives in the replicated
// log, beside the lease: StoreState is a command that the log applies only
// while this term's session and token still hold the lease there.
type term struct {
	*backend.BasicTerm
	b    *Backend
	h    *held
	prev *prevTerm
}

var (
	_ baton.StateTerm       = (*term)(nil)
	_ baton.PredecessorTerm = (*term)(nil)
)

// Predecessor implements baton.PredecessorTerm: the term before this one,
// as the log that granted it recorded it.
func (t *term) Predecessor() (baton.Predecessor, bool) {
	if t.prev == nil {
		return baton.Predecessor{}, false
	}
	return t.prev.predecessor(), true
}

// LoadState implements baton.StateTerm: a linearizable read through the
// raft leader (after it confirmed its leadership with a quorum). It works
// after the term ended too.
func (t *term) LoadState(ctx context.Context) ([]byte, error) {
	v, err := t.b.g.loadState(ctx, t.h.name)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: lease %q: load state: %w", baton.ErrBackendUnavailable, t.h.name, err)
	}
	if !v.Stored {
		return nil, nil
	}
	if v.Value == nil {
		return []byte{}, nil
	}
	return v.Value, nil
}

// StoreState implements baton.StateTerm. The log fences the write: it
// replaces the state only if the lease's holder there is still this term's
// session with this term's token. When it is not, the term ends with an
// error wrapping baton.ErrLeaseLost, which StoreState returns.
func (t *term) StoreState(ctx context.Context, value []byte) error {
	if err := backend.CheckStateSize(value); err != nil {
		return err
	}
	if err := backend.EndedError(t); err != nil {
		return err
	}
	h := t.h
	sctx, cancel := h.s.Bound(ctx)
	defer cancel()
	res, err := t.b.g.apply(sctx, command{Op: opStateStore, Session: h.s.ID, Lease: h.name, Token: h.token,
		Value: value, Time: time.Now()})
	if err != nil {
		if eerr := backend.EndedError(t); eerr != nil {
			// The session ended meanwhile, and the term with it.
			err = eerr
		}
		return fmt.Errorf("%w: lease %q: store state (it may or may not have been stored): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	switch {
	case res.Lost:
		t.b.unwatch(h)
		h.s.Forget(h.term)
		lost := fmt.Errorf("%w: lease %q: the group says this term (token %d) no longer holds it, so it did not store the state", baton.ErrLeaseLost, h.name, h.token)
		if h.term.End(lost) {
			b := t.b
			b.log.Info("lease lost (found storing its state)", "lease", h.name, "token", h.token)
			b.sessions.Unclaim(h.sl)
			return lost
		}
		return backend.EndedError(t)
	case res.Err != "":
		return fmt.Errorf("%w: lease %q: store state refused: %s", baton.ErrBackendUnavailable, h.name, res.Err)
	}
	return nil
}

// watchHeld ends h's term when the log says the lease went to another
// term (the raft leader expired the session, say), on an agent client:
// there it long-polls the agent for h's lease. It returns when ctx ends:
// the term was released, or the session ended.
func (b *Backend) watchHeld(ctx context.Context, h *held, at uint64) {
	defer h.stop()
	minIndex, after := at, uint64(0)
	for {
		v, err := b.g.wait(ctx, h.name, h.s.ID, minIndex, after)
		if err != nil {
			return
		}
		if v.Session != h.s.ID || v.Token != h.token {
			b.lose(h)
			return
		}
		minIndex, after = v.Index, v.Modified
	}
}

// lose ends h's term: the log gave its lease to another term.
func (b *Backend) lose(h *held) {
	h.s.Forget(h.term)
	if h.term.End(fmt.Errorf("%w: lease %q: the group gave it to another term (this session's renewals did not reach the raft leader in time)", baton.ErrLeaseLost, h.name)) {
		b.log.Info("lease lost", "lease", h.name, "token", h.token)
	}
	b.sessions.Unclaim(h.sl)
}

// release gives h's lease back. BasicTerm calls it once, after the term
// ended.
func (b *Backend) release(ctx context.Context, h *held) error {
	b.unwatch(h)
	h.s.Forget(h.term)
	defer b.sessions.Unclaim(h.sl)
	if h.s.Context().Err() != nil {
		return nil // the session is gone, and the lease with it
	}
	rctx, cancel := h.s.Bound(ctx)
	defer cancel()
	_, err := b.g.apply(rctx, command{Op: opRelease, Session: h.s.ID, Lease: h.name, Token: h.token, Time: time.Now()})
	if err != nil {
		if h.s.Context().Err() != nil {
			return nil
		}
		b.releaseLater(h.name, h.s, h.token)
		return fmt.Errorf("%w: release lease %q (retried in the background while the session lives): %w", baton.ErrBackendUnavailable, h.name, err)
	}
	b.log.Debug("released", "lease", h.name, "token", h.token)
	return nil
}

// Leader implements baton.Backend: linearizable through the raft leader,
// or from the nearest copy of the log with Options.StaleReads.
func (b *Backend) Leader(ctx context.Context, name string) (baton.Record, error) {
	v, err := b.g.read(ctx, name, "", b.stale)
	if err != nil {
		return baton.Record{}, readErr(ctx, fmt.Sprintf("lease %q", name), err)
	}
	return recordOf(name, v)
}

// readErr is Leader's error when a read of what (a lease, some leases)
// failed with err.
func readErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		if errors.Is(err, ctx.Err()) {
			// What the group answered last (a member that knows no raft
			// leader, one that could not reach it) says more than the
			// deadline alone.
			return err
		}
		return ctx.Err()
	}
	if ce := (*baton.ConfigError)(nil); errors.As(err, &ce) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", baton.ErrBackendUnavailable, what, err)
}

// recordOf is Leader's answer for lease name whose state is v.
func recordOf(name string, v leaseView) (baton.Record, error) {
	if v.Session == "" {
		return baton.Record{}, fmt.Errorf("%w: lease %q", baton.ErrNoLeader, name)
	}
	return baton.Record{Lease: name, Holder: v.Candidate, Token: v.Token, Since: v.Since}, nil
}

var _ baton.LeadersReader = (*Backend)(nil)

// Leaders implements baton.LeadersReader: what Leader says of each name,
// from one read of up to 1,024 leases, which on the raft leader confirms
// its leadership once for all of them (Leader confirms it per lease).
func (b *Backend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	recs, errs := make([]baton.Record, len(names)), make([]error, len(names))
	for lo := 0; lo < len(names); lo += maxReadMany {
		hi := min(lo+maxReadMany, len(names))
		vs, err := b.g.readMany(ctx, names[lo:hi], b.stale)
		if err != nil {
			err = readErr(ctx, fmt.Sprintf("%d leases", hi-lo), err)
		}
		for i := lo; i < hi; i++ {
			if err != nil {
				errs[i] = err
				continue
			}
			recs[i], errs[i] = recordOf(names[i], vs[i-lo])
		}
	}
	return recs, errs
}

// Close ends every term with baton.ErrClosed and destroys the session,
// which releases its leases at once; ctx bounds that last call. It does not
// close the Group.
func (b *Backend) Close(ctx context.Context) error {
	return b.sessions.Close(ctx, nil)
}
