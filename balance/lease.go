package balance

import (
	"context"
	"errors"
	"time"

	"github.com/batonhq/baton"
)

// runJob campaigns for j's lease whenever the balance rules want it, and runs
// j's Func while it leads, until ctx ends or the rules want nothing of the
// lease until the view or the load changes: then it parks the job (clears
// its loop under Group.mu, so that the next broadcastLocked starts a new
// one if needed) and reports true.
func (g *Group) runJob(ctx context.Context, j *job) (parked bool) {
	bo := &j.bo
	failing := false // log a run of campaign failures once, not per retry
	failed := func(err error, _ time.Duration) bool {
		g.mu.Lock()
		j.lastErr = err
		g.mu.Unlock()
		if !failing {
			g.log.Warn("campaign failed; retrying with back-off", "lease", j.name, "err", err)
		} else {
			g.log.Debug("campaign failed again", "lease", j.name, "err", err)
		}
		failing = true
		return true
	}
	for ctx.Err() == nil {
		g.mu.Lock()
		want, at := g.stanceLocked(j, time.Now())
		if !want && at.IsZero() {
			j.running, j.stop, j.done = false, nil, nil
			g.mu.Unlock()
			return true
		}
		changed := g.changed
		g.mu.Unlock()
		if !want {
			waitChange(ctx, changed, at)
			continue
		}
		t, err := g.campaign(ctx, j, bo, failed)
		switch {
		case ctx.Err() != nil:
			return false
		case errors.Is(err, errStance):
			continue
		case err != nil:
			// The backend was closed, or refuses the configuration
			// (*baton.ConfigError): no retry fixes either.
			g.fail(err)
			return false
		}
		if failing {
			g.log.Info("campaigning works again", "lease", j.name)
			failing = false
		}
		ferr := g.lead(ctx, j, t)
		if ferr != nil && ctx.Err() == nil {
			wait := bo.Next()
			if errors.Is(ferr, errTooShort) {
				// The backend's renewals lag (baton.Lead logged it):
				// campaigning again at once would win the lease as
				// short, once per round trip, each time taking a
				// fencing token.
				g.log.Debug("won a term too short to lead; campaigning again after a back-off", "lease", j.name, "token", t.Token(), "retry_in", wait)
			} else {
				g.mu.Lock()
				j.lastErr = ferr
				g.mu.Unlock()
				g.log.Warn("lease callback failed; campaigning again after a back-off", "lease", j.name, "token", t.Token(), "err", ferr, "retry_in", wait)
			}
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return false
			case <-timer.C:
			}
			continue
		}
		bo.Reset()
	}
	return false
}

// waitChange waits until ctx ends, changed is closed, or at passes (when not
// zero).
func waitChange(ctx context.Context, changed <-chan struct{}, at time.Time) {
	var timeout <-chan time.Time
	if !at.IsZero() {
		timer := time.NewTimer(time.Until(at))
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-ctx.Done():
	case <-changed:
	case <-timeout:
	}
}

// stanceLocked decides whether to campaign for j's lease now. When not, and
// the answer changes by itself at a known time (a Delay running out), it
// returns that time.
func (g *Group) stanceLocked(j *job, now time.Time) (bool, time.Time) {
	if !g.ready || j.term != nil || g.jobs[j.name] != j {
		return false, time.Time{}
	}
	if j.unsure {
		// We gave it up or won and resigned it: wait for the next refresh to
		// say who took it (see lead).
		return false, time.Time{}
	}
	lo, _ := g.shareLocked()
	if g.load < lo {
		// Eager: for the leases we stand by for at once, and for the
		// others once two refreshes in a row have read them free and they
		// have looked free for half a Delay, so that their ring members,
		// eager too, take them first (after a start, every instance would
		// otherwise campaign for every lease: N × L campaigns); but before
		// an instance at its share, which waits a whole Delay.
		if j.standby {
			return true, time.Time{}
		}
		if !j.freeSince.IsZero() && j.freeReads >= 2 {
			at := j.freeSince.Add(g.cfg.Delay / 2)
			return !now.Before(at), at
		}
		return false, time.Time{}
	}
	if !j.freeSince.IsZero() {
		at := g.takeAtLocked(j)
		return !now.Before(at), at
	}
	// A live holder, or one we have not read: stand by if we are one of the
	// lease's ring members (see standbyLocked).
	return j.standby, time.Time{}
}

// delayLocked is how long a lease must have looked free before this
// instance, at its load, campaigns for it and keeps it: one Delay per lease at
// or above floor(leases/N).
func (g *Group) delayLocked() time.Duration {
	lo, _ := g.shareLocked()
	return time.Duration(max(g.load-lo+1, 0)) * g.cfg.Delay
}

// loadChangedLocked wakes the job loops after the load changed from old,
// if that can change the stance of one that is not leading: when the load
// crossed floor(leases/N) (eager or not), or when a lease looks free (its
// wait depends on the load and on when we last took one). Otherwise the
// stance of every other job is what it was, and an instance with thousands
// of leases would wake them all for nothing on every lease it takes.
func (g *Group) loadChangedLocked(old int) {
	lo, _ := g.shareLocked()
	if (old < lo) != (g.load < lo) {
		g.broadcastLocked()
		return
	}
	if g.load < lo {
		return // eager before and after: for every lease not led
	}
	for _, j := range g.jobs {
		if j.term == nil && !j.freeSince.IsZero() {
			g.broadcastLocked()
			return
		}
	}
}

// takeAtLocked is when this instance, at its load, may campaign for j's
// free lease and keep it: delayLocked after the lease became free, and
// after this instance last took a lease. The second bound paces an
// instance that wins several free leases at once (its campaigns for them
// are all open): without it, once the first delay has run out, it would
// keep every one it wins, above the load of instances still waiting their
// turn, and shed the excess again later.
func (g *Group) takeAtLocked(j *job) time.Time {
	from := j.freeSince
	if g.gained.After(from) {
		from = g.gained
	}
	at := from.Add(g.delayLocked())
	if g.eagerOthers {
		// Another member said it leads fewer than floor(leases/N): it takes
		// free leases at once, and we leave them to it unless it has not
		// for ShedAfter (it cannot reach the backend, say).
		at = later(at, j.freeSince.Add(g.cfg.ShedAfter))
	}
	return at
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// admitLocked decides whether to keep a lease just won.
func (g *Group) admitLocked(j *job, now time.Time) bool {
	if g.jobs[j.name] != j {
		return false // removed meanwhile
	}
	lo, _ := g.shareLocked()
	if g.load < lo {
		return true
	}
	return !j.freeSince.IsZero() && !now.Before(g.takeAtLocked(j))
}

// campaign campaigns for j's lease until it wins, ctx ends, campaigning
// cannot succeed, or the balance rules stop wanting it (errStance: the
// broadcast that changes the stance cancels the campaign, see wakeLocked).
// It retries failures with bo, telling failed.
func (g *Group) campaign(ctx context.Context, j *job, bo *baton.Backoff, failed func(error, time.Duration) bool) (baton.Term, error) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g.mu.Lock()
	if want, _ := g.stanceLocked(j, time.Now()); !want {
		g.mu.Unlock()
		return nil, errStance
	}
	j.campaigning = cancel
	g.mu.Unlock()
	t, err := baton.Campaign(cctx, g.b, j.name, g.cfg.Candidate, bo, failed)
	g.mu.Lock()
	j.campaigning = nil
	g.mu.Unlock()
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), errStance) {
		return nil, errStance
	}
	return t, err
}

// lead keeps or refuses a term just won and, when it keeps it, runs j's Func
// for the term (baton.Lead) and resigns afterwards. It returns the Func's
// error, or errTooShort when baton.Lead resigned the term without calling
// back (too little time was left before its safe-until).
func (g *Group) lead(ctx context.Context, j *job, t baton.Term) error {
	// endLead ends the Func with a cause of the Group's (errShed,
	// errRemoved), which baton.Lead's context passes on.
	lctx, endLead := context.WithCancelCause(ctx)
	defer endLead(nil)
	admitted, called := false, false
	var fctx context.Context // the Func's: its cause says who ended it first
	ferr := baton.Lead(lctx, t, baton.LeadConfig{
		StopEarly:     g.cfg.StopEarly,
		ResignTimeout: g.cfg.ResignTimeout,
		Logger:        g.log.With("lease", j.name),
	}, func(ctx context.Context, t baton.Term) error {
		fctx, called = ctx, true
		now := time.Now()
		g.mu.Lock()
		admitted = g.admitLocked(j, now)
		if admitted {
			j.term, j.since, j.endLead = t, now, endLead
			j.freeSince, j.freeReads = time.Time{}, 0
			j.lastErr = nil
			g.load++
			g.gained = now
			g.loadChangedLocked(g.load - 1)
		} else if j.freeSince.IsZero() {
			// Won as a standby: we resign it, and campaign for it again
			// only once the next refresh has read who took it, or that
			// nobody did (then after our Delay). An eager instance whose
			// campaign is open normally takes it within milliseconds of
			// our resign; had we counted it free from now, our Delay would
			// be all that stood between it and us, and a busy machine can
			// take that long to run its campaign.
			j.unsure, j.holder = true, ""
		}
		load := g.load
		g.mu.Unlock()
		if !admitted {
			g.log.Debug("won a lease above the fair share; resigning it to a less loaded instance", "lease", j.name, "token", t.Token(), "load", load)
			return nil
		}
		g.log.Info("leading", "lease", j.name, "token", t.Token(), "load", load)
		return j.fn(fctx, t)
	})
	if !called {
		return errTooShort
	}
	if !admitted {
		return nil
	}
	cause := context.Cause(fctx)

	g.mu.Lock()
	j.term, j.endLead = nil, nil
	g.load--
	// Whether a lease we shed or lost is free, and since when, is for the
	// next refresh to read: the instance it was shed to takes it first.
	j.unsure, j.holder = true, ""
	if ferr != nil {
		j.lastErr = ferr
	}
	g.loadChangedLocked(g.load + 1)
	g.mu.Unlock()
	reason := t.Err()
	if errors.Is(cause, errShed) || errors.Is(cause, errRemoved) {
		reason = cause
	}
	g.log.Info("term ended", "lease", j.name, "token", t.Token(), "reason", reason)
	return ferr
}
