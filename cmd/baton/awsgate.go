package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/aws"
)

// gatedBackend campaigns only while the instance is InService (an instance
// that is Pending, in Standby or on its way out must not take the lease),
// and asks a term to resign when the instance leaves InService. The
// resign is only asked for: the Elector stops the work first and then
// releases the lease, as for any requested resign.
type gatedBackend struct {
	baton.Backend
	st  instanceState
	log *slog.Logger
	// tag, if set, runs for each term (the leader tag), on its own
	// goroutine.
	tag func(baton.Term)
}

// instanceState is what the gate reads of the instance: *aws.Instance.
type instanceState interface {
	InService() bool
	InServiceChanged() <-chan struct{}
	Leaving() <-chan struct{}
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
func (g *gatedBackend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	inst := g.st
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
		go func() {
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
		}()
		t, err := g.Backend.Campaign(cctx, name, c)
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
func (g *gatedBackend) gate(t baton.Term) baton.Term {
	gt := &gatedTerm{Term: t, req: make(chan struct{})}
	inst := g.st
	if g.tag != nil {
		g.tag(t)
	}
	go func() {
		inner := baton.ResignRequestedOf(t)
		for {
			changed := inst.InServiceChanged()
			if !inst.InService() {
				select {
				case <-inst.Leaving():
					// The command is stopping as on SIGTERM, and says
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
	}()
	if st, ok := t.(baton.StateTerm); ok {
		return &gatedStateTerm{gatedTerm: gt, st: st}
	}
	return gt
}

// tagTimeout bounds removing the leader tag after a term.
const tagTimeout = 30 * time.Second

// tag keeps the leader tag on this instance for term t: Elected (which
// first removes the tag from every other instance of the group) under a
// context that ends with the term, so that it never tags after the term,
// then Demoted once the term has ended.
func (s *awsSession) tag(tg *aws.Tagger, t baton.Term) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-t.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := tg.Elected(ctx, t.Token()); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("leader tag not set; the lease holds all the same", "lease", t.Lease(), "token", t.Token(), "err", err)
		}
	} else {
		s.log.Info("leader tag set", "lease", t.Lease(), "token", t.Token())
	}
	<-t.Done()
	cancel()
	dctx, dcancel := context.WithTimeout(context.Background(), tagTimeout)
	defer dcancel()
	if err := tg.Demoted(dctx); err != nil {
		s.log.Warn("leader tag not removed; the next leader removes it", "lease", t.Lease(), "token", t.Token(), "err", err)
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
)
