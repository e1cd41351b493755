package balance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/batonhq/baton"
)

const (
	// scanSpare is how many slots past the highest occupied one a refresh
	// reads, so that instances joining between two refreshes are seen.
	scanSpare = 8
	// reapSuccessors is how many following members each member watches.
	reapSuccessors = 2
	// standbys is how many members stand by for each lease held by another:
	// the ones after the holder in slot order.
	standbys = 2
	// joinChoices is how many of the lowest free slots a joining instance
	// picks from at random, so that instances starting together rarely try
	// the same slot.
	joinChoices = 4
	// scanParallel bounds the concurrent Leader requests of one scan.
	scanParallel = 8
)

// slotName is the lease name of member slot i.
func (g *Group) slotName(i int) string { return g.prefix + strconv.Itoa(i) }

// reaper watches another member's slot and frees it when that member is gone.
type reaper struct {
	holder string
	cancel context.CancelFunc
	done   chan struct{}
}

// refresh is the Group's background loop: it holds a member slot, counts the
// members, reads who holds the leases, and sheds excess leases, every
// RefreshInterval until ctx ends. Then it resigns the slot.
func (g *Group) refresh(ctx context.Context) {
	var (
		home     baton.Term
		homeSlot = -1
		limit    = g.cfg.MaxMembers // the first scan reads every slot
		reapers  = map[int]*reaper{}
	)
	defer func() {
		g.adjustReapers(ctx, reapers, nil)
		if home != nil {
			g.resign(ctx, home)
		}
		g.mu.Lock()
		g.ready, g.slot, g.members, g.counts, g.watch = false, -1, nil, nil, nil
		g.overSince, g.backoff, g.gained = time.Time{}, 1, time.Time{}
		clear(g.sheds)
		for _, j := range g.jobs {
			j.scanned, j.holder, j.freeSince = false, "", time.Time{}
		}
		g.broadcastLocked()
		g.mu.Unlock()
	}()
	for {
		if home != nil && home.Err() != nil {
			g.log.Warn("lost the member slot; joining again", "slot", homeSlot, "reason", home.Err())
			home, homeSlot = nil, -1
		}
		occ, err := g.scanSlots(ctx, limit)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			g.log.Warn("reading the member slots failed; keeping the last view", "err", err)
		default:
			if home == nil {
				g.adjustReapers(ctx, reapers, nil) // before campaigning for a slot they might watch
				home, homeSlot = g.join(ctx, occ, limit)
				if home != nil {
					occ[homeSlot] = g.cfg.Candidate.ID
				}
			}
			highest := homeSlot
			for i := range occ {
				highest = max(highest, i)
			}
			limit = min(g.cfg.MaxMembers, highest+1+scanSpare)
			g.setView(occ, homeSlot)
			g.adjustReapers(ctx, reapers, g.successors(occ, homeSlot))
		}
		if g.isReady() {
			g.scanLeases(ctx)
			g.maybeShed(time.Now())
		}
		var homeDone <-chan struct{}
		if home != nil {
			homeDone = home.Done()
		}
		timer := time.NewTimer(g.cfg.RefreshInterval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-homeDone:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (g *Group) isReady() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ready
}

// scanTimeout bounds one scan, so that a hung backend delays the next
// refresh rather than stopping refreshes.
func (g *Group) scanTimeout() time.Duration {
	return max(2*g.cfg.RefreshInterval, time.Second)
}

// leaders asks for the holder of each name, a few at a time. A holder of ""
// means nobody holds the lease; errs[i] is non-nil when the backend could not
// say.
func (g *Group) leaders(ctx context.Context, names []string) (holders []string, errs []error) {
	ctx, cancel := context.WithTimeout(ctx, g.scanTimeout())
	defer cancel()
	holders, errs = make([]string, len(names)), make([]error, len(names))
	sem := make(chan struct{}, scanParallel)
	var wg sync.WaitGroup
	for i, name := range names {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rec, err := g.b.Leader(ctx, name)
			switch {
			case errors.Is(err, baton.ErrNoLeader):
			case err != nil:
				errs[i] = err
			default:
				holders[i] = rec.Holder
			}
		})
	}
	wg.Wait()
	return holders, errs
}

// summarize returns nil when errs holds no error, else one error that counts
// them and wraps the first: a scan of many leases fails for one reason.
func summarize(errs []error) error {
	n, first := 0, error(nil)
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d reads failed, the first with: %w", n, len(errs), first)
}

// scanSlots returns the holder of every occupied member slot below limit.
func (g *Group) scanSlots(ctx context.Context, limit int) (map[int]string, error) {
	names := make([]string, limit)
	for i := range names {
		names[i] = g.slotName(i)
	}
	holders, errs := g.leaders(ctx, names)
	if err := summarize(errs); err != nil {
		return nil, err
	}
	occ := map[int]string{}
	for i, h := range holders {
		if h != "" {
			occ[i] = h
		}
	}
	return occ, nil
}

// join campaigns for a free member slot, giving up after half a refresh
// (another instance took it first) so that the next refresh tries another.
func (g *Group) join(ctx context.Context, occ map[int]string, limit int) (baton.Term, int) {
	var free []int
	for i := 0; i < g.cfg.MaxMembers && len(free) < joinChoices; i++ {
		if _, taken := occ[i]; !taken || i >= limit {
			free = append(free, i)
		}
	}
	if len(free) == 0 {
		g.log.Warn("every member slot is taken: this instance counts itself but the others do not count it; raise MaxMembers", "max_members", g.cfg.MaxMembers)
		return nil, -1
	}
	slot := free[rand.N(len(free))]
	jctx, cancel := context.WithTimeout(ctx, max(g.cfg.RefreshInterval/2, 10*time.Millisecond))
	defer cancel()
	t, err := g.b.Campaign(jctx, g.slotName(slot), g.cfg.Candidate)
	switch {
	case err == nil:
		g.log.Info("joined the group", "slot", slot)
		return t, slot
	case errors.Is(err, baton.ErrClosed):
		g.fail(err)
	case ctx.Err() == nil && jctx.Err() == nil:
		g.log.Warn("taking a member slot failed; retrying at the next refresh", "slot", slot, "err", err)
	}
	return nil, -1
}

// setView publishes a new member view.
func (g *Group) setView(occ map[int]string, homeSlot int) {
	members := map[string]struct{}{g.cfg.Candidate.ID: {}}
	for _, id := range occ {
		members[id] = struct{}{}
	}
	g.mu.Lock()
	if len(members) != len(g.members) {
		g.log.Info("group size changed", "members", len(members), "leases", len(g.jobs))
	}
	watch := g.watched(occ)
	// Every job loop waits on the broadcast: wake them only when their
	// stance may change, not every refresh (thousands of leases per
	// instance, each woken every refresh, cost more than the refresh).
	same := g.ready && g.slot == homeSlot && maps.Equal(g.members, members) && maps.Equal(g.watch, watch)
	g.members, g.slot, g.ready, g.watch = members, homeSlot, true, watch
	if !same {
		g.broadcastLocked()
	}
	g.mu.Unlock()
}

// watched returns the members whose leases this instance stands by for:
// those it follows within standbys places in slot order, wrapping around.
// So every lease held by a member has that many standbys (fewer in a
// smaller group), and each instance stands by for about
// standbys × leases / N of them.
func (g *Group) watched(occ map[int]string) map[string]bool {
	slots := make([]int, 0, len(occ))
	for i := range occ {
		slots = append(slots, i)
	}
	slices.Sort(slots)
	watch := map[string]bool{}
	for i, s := range slots {
		for d := 1; d <= standbys && d < len(slots); d++ {
			if occ[slots[(i+d)%len(slots)]] == g.cfg.Candidate.ID && occ[s] != g.cfg.Candidate.ID {
				watch[occ[s]] = true
			}
		}
	}
	return watch
}

// successors returns the slots (and holders) of the next reapSuccessors other
// members after homeSlot, in slot order, wrapping around.
func (g *Group) successors(occ map[int]string, homeSlot int) map[int]string {
	if homeSlot < 0 {
		return nil
	}
	slots := make([]int, 0, len(occ))
	for i, id := range occ {
		if id != g.cfg.Candidate.ID {
			slots = append(slots, i)
		}
	}
	// Order by distance after homeSlot, wrapping around.
	dist := func(i int) int { return (i - homeSlot + g.cfg.MaxMembers) % g.cfg.MaxMembers }
	slices.SortFunc(slots, func(a, b int) int { return cmp.Compare(dist(a), dist(b)) })
	want := map[int]string{}
	for _, i := range slots[:min(len(slots), reapSuccessors)] {
		want[i] = occ[i]
	}
	return want
}

// adjustReapers stops the reapers not in want (or whose slot changed hands)
// and starts the missing ones. It waits for the stopped ones, so that a
// campaign for the same slot never overlaps one of theirs.
func (g *Group) adjustReapers(ctx context.Context, reapers map[int]*reaper, want map[int]string) {
	for slot, r := range reapers {
		finished := false
		select {
		case <-r.done:
			finished = true
		default:
		}
		if h, ok := want[slot]; !ok || h != r.holder || finished {
			r.cancel()
			<-r.done
			delete(reapers, slot)
		}
	}
	for slot, holder := range want {
		if _, ok := reapers[slot]; ok {
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		r := &reaper{holder: holder, cancel: cancel, done: make(chan struct{})}
		reapers[slot] = r
		go func() {
			defer close(r.done)
			t, err := g.b.Campaign(rctx, g.slotName(slot), g.cfg.Candidate)
			if err != nil {
				if rctx.Err() == nil && !errors.Is(err, baton.ErrClosed) {
					g.log.Debug("watching a member slot failed", "slot", slot, "err", err)
				}
				return
			}
			// Won another member's slot: it resigned or died. Free it for
			// the next instance that joins.
			g.log.Info("freed the member slot of an instance that left", "slot", slot, "holder", holder)
			g.resign(ctx, t)
		}()
	}
}

// scanLeases reads the holder of every lease this instance does not lead,
// and from that how many leases each member leads.
func (g *Group) scanLeases(ctx context.Context) {
	g.mu.Lock()
	var names []string
	for name, j := range g.jobs {
		if j.term == nil {
			names = append(names, name)
		}
	}
	g.mu.Unlock()
	holders, errs := g.leaders(ctx, names)
	if ctx.Err() != nil {
		return
	}
	if err := summarize(errs); err != nil {
		g.log.Warn("reading lease holders failed; keeping their last known holders", "err", err)
	}

	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	changed := false // a job's stance may have changed
	for i, name := range names {
		j := g.jobs[name]
		if j == nil || j.term != nil || errs[i] != nil {
			continue
		}
		if !j.scanned || j.holder != holders[i] {
			changed = true
		}
		j.scanned, j.holder = true, holders[i]
		if g.liveOtherLocked(j.holder) {
			if !j.freeSince.IsZero() {
				j.freeSince, changed = time.Time{}, true
			}
		} else if j.freeSince.IsZero() {
			j.freeSince, changed = now, true
		}
	}
	counts := map[string]int{}
	for _, j := range g.jobs {
		if j.term == nil && j.scanned && g.liveOtherLocked(j.holder) {
			counts[j.holder]++
		}
	}
	g.counts = counts

	// Judge our recent sheds: did the lease go to somebody less loaded?
	for name, after := range g.sheds {
		j := g.jobs[name]
		switch {
		case j == nil:
			delete(g.sheds, name)
		case j.term != nil:
			g.shedResult(name, false) // back with us
		case j.scanned && g.liveOtherLocked(j.holder):
			g.shedResult(name, counts[j.holder] <= after)
		}
	}
	if changed {
		g.broadcastLocked()
	}
}

// liveOtherLocked reports whether id is another instance holding a member
// slot: a holder that is alive as far as the group can tell.
func (g *Group) liveOtherLocked(id string) bool {
	if id == "" || id == g.cfg.Candidate.ID {
		return false
	}
	_, ok := g.members[id]
	return ok
}

// shedResult records whether a shed moved a lease to a less loaded instance
// and sets the back-off for the next shed.
func (g *Group) shedResult(name string, productive bool) {
	delete(g.sheds, name)
	if productive {
		g.backoff = 1
		return
	}
	g.backoff = min(2*g.backoff, maxShedBackoff)
	g.log.Info("a shed lease did not go to a less loaded instance; shedding more slowly", "lease", name, "backoff", g.backoff)
}

// maybeShed gives up leases when this instance has led more than its share,
// with somebody below it, for ShedAfter (times the back-off).
func (g *Group) maybeShed(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	lo, hi := g.shareLocked()
	k := g.load
	n := 0
	if k > hi {
		room := 0
		for id := range g.members {
			if id != g.cfg.Candidate.ID {
				room += max(0, hi-g.counts[id])
			}
		}
		n = min(k-hi, room)
	} else if k > lo {
		for id := range g.members {
			if id != g.cfg.Candidate.ID && g.counts[id] < lo {
				n = 1
				break
			}
		}
	}
	if n == 0 {
		g.overSince = time.Time{}
		return
	}
	if g.overSince.IsZero() {
		g.overSince = now
	}
	if now.Sub(g.overSince) < time.Duration(g.backoff)*g.cfg.ShedAfter {
		return
	}
	g.overSince = now // the next shed needs another full ShedAfter

	var held []*job
	for _, j := range g.jobs {
		if j.term != nil && j.endLead != nil {
			held = append(held, j)
		}
	}
	// Newest first: the least work in progress, and the least settled.
	slices.SortFunc(held, func(a, b *job) int { return b.since.Compare(a.since) })
	held = held[:min(n, len(held))]
	names := make([]string, len(held))
	for i, j := range held {
		names[i] = j.name
		g.sheds[j.name] = k - len(held)
		j.endLead(errShed)
		j.endLead = nil
	}
	g.log.Info("shedding leases to less loaded instances", "leases", names, "load", k, "share", hi, "members", len(g.members))
}
