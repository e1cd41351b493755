package aws

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/batonhq/baton"
)

// InstanceState is what a Gate reads of the instance a process runs on:
// *Instance implements it.
type InstanceState interface {
	// InService reports whether the instance is InService in its group.
	InService() bool
	// InServiceChanged returns a channel closed at the next change of
	// InService.
	InServiceChanged() <-chan struct{}
	// Leaving returns a channel closed once the instance is leaving its
	// group.
	Leaving() <-chan struct{}
}

var _ InstanceState = (*Instance)(nil)

// GateOptions configures a Gate. The zero value means the documented
// defaults.
type GateOptions struct {
	// Tagger, if set, keeps the leader tag on this instance while it holds
	// a term of a gated backend: Tagger.Elected (which first removes the
	// tag from the group's other instances) under a context that ends with
	// the term, so that it never tags after the term, then Tagger.Demoted
	// once the term has ended. Failures are logged, never fatal: the
	// lease, not the tag, decides who leads. Default nil: no tag.
	Tagger *Tagger

	// Logger receives the gate's log lines. Nil (the default) means
	// silent.
	Logger *slog.Logger
}

// Gate ties campaigns to the instance's lifecycle state. A backend it
// wraps (Gate.Backend) campaigns only while the instance is InService (an
// instance that is Pending, in Standby or on its way out must not take a
// lease): a campaign waits while the instance is not InService, and a
// campaign under way is withdrawn when it leaves InService. A term of a
// gated backend asks to resign (baton.ResignRequestTerm) when the instance
// leaves InService; it is only asked: an Elector stops the work first and
// then releases the lease, as for any requested resign, so a hand-over
// never cuts work short.
//
// What it does not do: it cannot see a change of state sooner than
// InstanceState reports it (within the IMDS poll interval for *Instance),
// and it never ends a term itself; the lease's own safety (safe-until,
// fencing tokens) is untouched.
//
// Call Wait after every term of its backends has ended (the Elector's Run
// has returned), so that the leader tag is removed before the process
// exits. Safe for concurrent use.
type Gate struct {
	inst   InstanceState
	tagger *Tagger
	log    *slog.Logger
	wg     sync.WaitGroup // the goroutines started per campaign and per term
}

// NewGate returns a gate on inst.
func NewGate(inst InstanceState, opts GateOptions) *Gate {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gate{inst: inst, tagger: opts.Tagger, log: log}
}

// Backend returns b gated by the instance's lifecycle state. It keeps b's
// baton.LeaderWatcher and baton.LeadersReader (reads are not gated), and
// its terms keep baton.StateTerm.
func (g *Gate) Backend(b baton.Backend) baton.Backend {
	gb := &gatedBackend{Backend: b, g: g}
	if w, ok := b.(baton.LeaderWatcher); ok {
		return &gatedWatchBackend{gatedBackend: gb, w: w}
	}
	return gb
}

// Wait waits for the goroutines the gate started: for each ended term,
// until its leader tag is removed (bounded by a 30 s timeout per term).
// Call it once every term of the gate's backends has ended.
func (g *Gate) Wait() { g.wg.Wait() }

// gatedBackend is a Backend whose campaigns and terms the gate ties to the
// instance's state.
type gatedBackend struct {
	baton.Backend
	g *Gate
}

// Leaders implements baton.LeadersReader with the gated Backend's, or,
// for one without it, Leader for each name.
func (b *gatedBackend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	if lr, ok := b.Backend.(baton.LeadersReader); ok {
		return lr.Leaders(ctx, names)
	}
	recs, errs := make([]baton.Record, len(names)), make([]error, len(names))
	for i, name := range names {
		recs[i], errs[i] = b.Backend.Leader(ctx, name)
	}
	return recs, errs
}

// gatedWatchBackend is a gatedBackend over a baton.LeaderWatcher, which it
// stays.
type gatedWatchBackend struct {
	*gatedBackend
	w baton.LeaderWatcher
}

func (g *gatedWatchBackend) WatchLeader(ctx context.Context, name string, fn func(baton.Record, error)) error {
	return g.w.WatchLeader(ctx, name, fn)
}

// Campaign waits until the instance is InService, then campaigns; a
// campaign under way is withdrawn when the instance leaves InService, and
// the wait starts again.
func (b *gatedBackend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	g := b.g
	inst := g.inst
	for {
		changed := inst.InServiceChanged()
		if !inst.InService() {
			g.log.Info("instance not InService: not campaigning until it is", "lease", name)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-changed:
			}
			continue
		}
		cctx, cancel := context.WithCancel(ctx)
		left := make(chan struct{})
		g.wg.Go(func() {
			ch := changed
			for {
				select {
				case <-ch:
					ch = inst.InServiceChanged() // before InService: no change missed
					if !inst.InService() {
						close(left)
						cancel()
						return
					}
				case <-cctx.Done():
					return
				}
			}
		})
		t, err := b.Backend.Campaign(cctx, name, c)
		cancel() // it bounded the wait only
		select {
		case <-left:
			if err == nil {
				// Elected just as the instance left service: the term
				// asks to resign at once.
				return g.gate(t), nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			g.log.Info("instance left InService while campaigning: campaign withdrawn", "lease", name)
			continue
		default:
		}
		if err != nil {
			return nil, err
		}
		return g.gate(t), nil
	}
}

// gate wraps t so that it asks to resign when the instance leaves
// InService, keeping t's optional interfaces (the state of cron's slots).
func (g *Gate) gate(t baton.Term) baton.Term {
	gt := &gatedTerm{Term: t, req: make(chan struct{})}
	inst := g.inst
	if tg := g.tagger; tg != nil {
		g.wg.Go(func() { g.tag(tg, t) })
	}
	g.wg.Go(func() {
		inner := baton.ResignRequestedOf(t)
		for {
			changed := inst.InServiceChanged()
			if !inst.InService() {
				select {
				case <-inst.Leaving():
					// The process is stopping as on SIGTERM, and says
					// why; it resigns on its way out.
				default:
					g.log.Warn("instance left InService: stopping the work and resigning", "lease", t.Lease(), "token", t.Token())
				}
				gt.request()
				return
			}
			select {
			case <-t.Done():
				return
			case <-inner:
				gt.request()
				return
			case <-changed:
			}
		}
	})
	if st, ok := t.(baton.StateTerm); ok {
		return &gatedStateTerm{gatedTerm: gt, st: st}
	}
	return gt
}

// tagTimeout bounds removing the leader tag after a term.
const tagTimeout = 30 * time.Second

// tag keeps the leader tag on this instance for term t: Elected under a
// context that ends with the term, so that it never tags after the term,
// then Demoted once the term has ended.
func (g *Gate) tag(tg *Tagger, t baton.Term) {
	ctx, cancel := context.WithCancel(context.Background())
	g.wg.Go(func() {
		select {
		case <-t.Done():
			cancel()
		case <-ctx.Done():
		}
	})
	if err := tg.Elected(ctx, t.Token()); err != nil {
		if ctx.Err() == nil {
			g.log.Warn("leader tag not set; the lease holds all the same", "lease", t.Lease(), "token", t.Token(), "err", err)
		}
	} else {
		g.log.Info("leader tag set", "lease", t.Lease(), "token", t.Token())
	}
	<-t.Done()
	cancel()
	dctx, dcancel := context.WithTimeout(context.Background(), tagTimeout)
	defer dcancel()
	if err := tg.Demoted(dctx); err != nil {
		g.log.Warn("leader tag not removed; the next leader removes it", "lease", t.Lease(), "token", t.Token(), "err", err)
	}
}

// gatedTerm is a term that also asks to resign when its instance leaves
// InService (baton.ResignRequestTerm).
type gatedTerm struct {
	baton.Term
	once sync.Once
	req  chan struct{}
}

func (t *gatedTerm) request() { t.once.Do(func() { close(t.req) }) }

// ResignRequested is closed when the instance left InService or the
// backend relayed a resign request.
func (t *gatedTerm) ResignRequested() <-chan struct{} { return t.req }

// gatedStateTerm is a gatedTerm over a baton.StateTerm, which it stays.
type gatedStateTerm struct {
	*gatedTerm
	st baton.StateTerm
}

func (t *gatedStateTerm) LoadState(ctx context.Context) ([]byte, error) {
	return t.st.LoadState(ctx)
}

func (t *gatedStateTerm) StoreState(ctx context.Context, value []byte) error {
	return t.st.StoreState(ctx, value)
}

var (
	_ baton.ResignRequestTerm = (*gatedTerm)(nil)
	_ baton.StateTerm         = (*gatedStateTerm)(nil)
	_ baton.LeaderWatcher     = (*gatedWatchBackend)(nil)
	_ baton.LeadersReader     = (*gatedBackend)(nil)
)
