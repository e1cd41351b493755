package balance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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
	// ringMembers is how many members are a lease's ring members (see
	// standbyLocked): those of them that do not hold it stand by for it, so
	// a held lease has two or three standbys.
	ringMembers = 3
	// ringPoints is how many points each member has on the standby ring, so
	// that members stand by for about equal numbers of leases.
	ringPoints = 16
	// loadSep joins a member's ID and its load in the candidate ID it holds
	// its load slot with.
	loadSep = "|load="
	// joinChoices is how many of the lowest free slots a joining instance
	// picks from at random, so that instances starting together rarely try
	// the same slot.
	joinChoices = 4
	// scanParallel bounds the concurrent read requests of one scan.
	scanParallel = 8
	// leadersBatch is how many names one request of a scan asks for on a
	// Backend that reads many at once (baton.LeadersReader).
	leadersBatch = 128
)

// slotName is the lease name of member slot i.
func (g *Group) slotName(i int) string { return g.prefix + strconv.Itoa(i) }

// loadName is the lease name of load slot i, where the member holding
// member slot i publishes its load.
func (g *Group) loadName(i int) string { return g.loadPrefix + strconv.Itoa(i) }

// loadSlot is the load slot this instance holds, and the load it says.
type loadSlot struct {
	term baton.Term
	slot int
	load int
}

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
		occ      map[int]string // the last member view read
		pub      *loadSlot
	)
	defer func() {
		g.adjustReapers(ctx, reapers, nil)
		if pub != nil {
			g.resign(ctx, pub.term)
		}
		if home != nil {
			g.resign(ctx, home)
		}
		g.mu.Lock()
		g.ready, g.slot, g.members, g.scanned, g.counts, g.ring, g.fewSince = false, -1, nil, nil, nil, nil, time.Time{}
		g.loads, g.unknown, g.short, g.eagerOthers, g.sample, g.readCap = nil, nil, time.Time{}, false, 0, 0
		g.overSince, g.backoff, g.gained = time.Time{}, 1, time.Time{}
		clear(g.sheds)
		for _, j := range g.jobs {
			j.unsure, j.standby, j.holder, j.freeSince, j.freeReads = false, false, "", time.Time{}, 0
		}
		g.broadcastLocked()
		g.mu.Unlock()
	}()
	for {
		if home != nil && home.Err() != nil {
			g.log.Warn("lost the member slot; joining again", "slot", homeSlot, "reason", home.Err())
			home, homeSlot = nil, -1
		}
		read, err := g.scanSlots(ctx, limit)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			g.log.Warn("reading the member slots failed; keeping the last view", "err", err)
		default:
			occ = read
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
			pub = g.publish(ctx, pub, homeSlot)
			g.scanLeases(ctx, g.readLoads(ctx, occ))
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

// leaders asks for the holder of each name: a batch of names per request
// on a Backend that reads many at once (baton.LeadersReader), one name per
// request on any other; a few requests at a time. A holder of "" means
// nobody holds the lease; errs[i] is non-nil when the backend could not
// say.
func (g *Group) leaders(ctx context.Context, names []string) (holders []string, errs []error) {
	ctx, cancel := context.WithTimeout(ctx, g.scanTimeout())
	defer cancel()
	holders, errs = make([]string, len(names)), make([]error, len(names))
	set := func(i int, rec baton.Record, err error) {
		switch {
		case errors.Is(err, baton.ErrNoLeader):
		case err != nil:
			errs[i] = err
		default:
			holders[i] = rec.Holder
		}
	}
	lr, batched := g.b.(baton.LeadersReader)
	step := 1
	if batched {
		step = leadersBatch
	}
	sem := make(chan struct{}, scanParallel)
	var wg sync.WaitGroup
	for lo := 0; lo < len(names); lo += step {
		hi := min(lo+step, len(names))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if !batched {
				rec, err := g.b.Leader(ctx, names[lo])
				set(lo, rec, err)
				return
			}
			recs, rerrs := lr.Leaders(ctx, names[lo:hi])
			if len(recs) != hi-lo || len(rerrs) != hi-lo {
				err := fmt.Errorf("balance: %T.Leaders answered %d records and %d errors for %d names", g.b, len(recs), len(rerrs), hi-lo)
				for i := lo; i < hi; i++ {
					errs[i] = err
				}
				return
			}
			for k := range recs {
				set(lo+k, recs[k], rerrs[k])
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

// setView takes in a member scan. The view the Group acts on (the share,
// the standby ring) takes in a scan that counts more members than the
// last one only when the next scan reads the same members: instances that
// start together join over a few refreshes, and
// one that acted on its first views, which count only those that joined
// before it, would stand by for most leases and campaign for them, then
// cancel those campaigns as its view grows (a write each on etcd, for
// every lease, in every instance: more than the server applies). A view
// still growing changes nothing: before the first agreement the Group
// campaigns for nothing, and afterwards it keeps acting on its last view,
// which delays its response to a join by one refresh.
func (g *Group) setView(occ map[int]string, homeSlot int) {
	members := map[string]struct{}{g.cfg.Candidate.ID: {}}
	for _, id := range occ {
		members[id] = struct{}{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// A scan that counts no more members than the last one is not a view
	// still growing: a member left, or one left as another joined; act on
	// it at once, so that a group whose members churn still acts. Unless
	// it counts less than half the members of the view acted on: most
	// sessions ended at once (the store unreachable past the TTL, or too
	// busy to renew them in time), and the members are joining again, a
	// few each refresh, as at a start. A view of the first few to rejoin
	// would make each of them stand by for most leases and campaign for
	// them, keeping a busy store busy. Such a view is taken in only once
	// scans have counted so few for ShedAfter, the patience an instance
	// has before it gives leases up, and the next scan agrees.
	now := time.Now()
	few := 2*len(members) < len(g.members)
	switch {
	case !few:
		g.fewSince = time.Time{}
	case g.fewSince.IsZero():
		g.fewSince = now
	}
	shrunk := g.scanned != nil && len(members) <= len(g.scanned) && !few
	settled := shrunk || maps.Equal(g.scanned, members) && (!few || now.Sub(g.fewSince) >= g.cfg.ShedAfter)
	g.scanned = members
	if !settled {
		g.slot = homeSlot
		return
	}
	if len(members) != len(g.members) {
		g.log.Info("group size changed", "members", len(members), "leases", len(g.jobs))
	}
	// Every job loop waits on the broadcast: wake them only when their
	// stance may change, not every refresh (thousands of leases per
	// instance, each woken every refresh, cost more than the refresh).
	same := g.ready && g.slot == homeSlot && maps.Equal(g.members, members)
	g.members, g.slot, g.ready = members, homeSlot, true
	if !same {
		g.ring = newRing(members)
		for name, j := range g.jobs {
			j.standby = g.standbyLocked(name)
		}
		g.broadcastLocked()
	}
}

// ringPoint is one of a member's points on the standby ring.
type ringPoint struct {
	at uint64
	id string
}

// newRing places every member at ringPoints pseudo-random points of a
// ring, by a hash of its ID, so that every instance builds the same ring
// from the same members.
func newRing(members map[string]struct{}) []ringPoint {
	ring := make([]ringPoint, 0, len(members)*ringPoints)
	for id := range members {
		for i := range ringPoints {
			ring = append(ring, ringPoint{hash64(id + "#" + strconv.Itoa(i)), id})
		}
	}
	slices.SortFunc(ring, func(a, b ringPoint) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.id, b.id))
	})
	return ring
}

// hash64 places s on the standby ring: FNV-1a, then a finalizer that
// mixes every bit into every other (MurmurHash3's fmix64). FNV-1a alone
// moves a hash by under a millionth of the ring for a change in the last
// byte, and by under a thousandth for one in the byte before, so names
// that differ in their last characters ("job-0001", "job-0002", and a
// member's points "ID#0" … "ID#15") would land next to each other: one
// member's points at two places, and each group of names on the same
// three ring members.
func hash64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// standbyLocked reports whether this instance is one of the lease's ring
// members: the first ringMembers distinct members met going round the ring
// from the lease's hash. Those of them that do not hold the lease keep a
// campaign open for it (they stand by), so that a dead or resigning holder
// is noticed and the lease taken over (on record stores only a candidate
// that watched the lease for a TTL takes it over), with no instance reading
// who holds it. Every instance standing by for every lease would cost N-1
// open campaigns per lease, and as many wins and resigns each time a lease
// changes hands, racing the instance that should take it. Placing the
// standbys by the lease's name rather than by its holder means an instance
// knows what it stands by for without reading any holder, and a member
// joining or leaving moves only the leases next to its points.
func (g *Group) standbyLocked(name string) bool {
	return slices.Contains(g.ringMembersLocked(name), g.cfg.Candidate.ID)
}

// ringMembersLocked returns the lease's ring members: the first
// ringMembers distinct members met going round the ring from the lease's
// hash.
func (g *Group) ringMembersLocked(name string) []string {
	if len(g.ring) == 0 {
		return nil
	}
	h := hash64(name)
	i, _ := slices.BinarySearchFunc(g.ring, h, func(p ringPoint, h uint64) int { return cmp.Compare(p.at, h) })
	seen := make([]string, 0, ringMembers)
	for k := 0; k < len(g.ring) && len(seen) < min(ringMembers, len(g.members)); k++ {
		id := g.ring[(i+k)%len(g.ring)].id
		if !slices.Contains(seen, id) {
			seen = append(seen, id)
		}
	}
	return seen
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

// publish holds the load slot of our member slot with a candidate ID that
// says our load: "<ID>|load=<k>". A changed load is published by resigning
// the slot and campaigning again with the new ID, at most once a refresh.
// It returns what it holds, nil when nothing.
func (g *Group) publish(ctx context.Context, pub *loadSlot, homeSlot int) *loadSlot {
	g.mu.Lock()
	load := g.load
	g.mu.Unlock()
	if pub != nil && pub.slot == homeSlot && pub.load == load && pub.term.Err() == nil {
		return pub
	}
	if pub != nil {
		g.resign(ctx, pub.term)
	}
	if homeSlot < 0 {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, max(g.cfg.RefreshInterval/2, 10*time.Millisecond))
	defer cancel()
	t, err := g.b.Campaign(pctx, g.loadName(homeSlot), baton.Candidate{ID: g.cfg.Candidate.ID + loadSep + strconv.Itoa(load)})
	if err != nil {
		// Another instance's stale holding (on a record store, one that
		// died in this slot) is taken over after a TTL; meanwhile the
		// others count us by a scan.
		if ctx.Err() == nil && !errors.Is(err, baton.ErrClosed) {
			g.log.Debug("publishing the load failed; retrying at the next refresh", "slot", homeSlot, "err", err)
		}
		return nil
	}
	return &loadSlot{term: t, slot: homeSlot, load: load}
}

// loadRead is the result of reading the other members' load slots.
type loadRead struct {
	known  map[string]int      // load by member ID
	failed map[string]struct{} // members whose load slot could not be read
}

// readLoads reads the load slot of every other member in occ.
func (g *Group) readLoads(ctx context.Context, occ map[int]string) loadRead {
	var names, ids []string
	for slot, id := range occ {
		if id != g.cfg.Candidate.ID {
			names = append(names, g.loadName(slot))
			ids = append(ids, id)
		}
	}
	holders, errs := g.leaders(ctx, names)
	r := loadRead{known: map[string]int{}, failed: map[string]struct{}{}}
	for i, id := range ids {
		if errs[i] != nil {
			r.failed[id] = struct{}{}
			continue
		}
		rest, ok := strings.CutPrefix(holders[i], id+loadSep)
		if !ok {
			continue // not published yet, or a stale holding of the slot
		}
		if k, err := strconv.Atoi(rest); err == nil && k >= 0 {
			r.known[id] = k
		}
	}
	if err := summarize(errs); err != nil {
		g.log.Warn("reading the members' loads failed; keeping their last known loads", "err", err)
	}
	return r
}

// scanLeases takes in the members' published loads and reads the holders
// of the leases this instance needs to know about: those it gave up or
// stood by for and resigned (unsure), and those it saw free, to learn who
// took them. It reads every lease it does not lead only when the published
// loads leave leases unaccounted for and it is one that should take them
// (see docs/balance.md), or a member's load has been unknown for two
// refreshes: so that, once the spread is even, a refresh reads no lease.
func (g *Group) scanLeases(ctx context.Context, lr loadRead) {
	now := time.Now()
	g.mu.Lock()
	if g.loads == nil {
		g.loads, g.unknown = map[string]int{}, map[string]time.Time{}
	}
	stale := false
	for id := range g.members {
		if id == g.cfg.Candidate.ID {
			continue
		}
		if k, ok := lr.known[id]; ok {
			g.loads[id] = k
			delete(g.unknown, id)
			continue
		}
		if _, failed := lr.failed[id]; failed {
			continue // keep the last known load
		}
		// Not published: a member that just joined (it leads nothing
		// yet), one between the resign and the campaign that publish a
		// new load (keep the last one: counting it as zero would make
		// every other member shed to it), or a stale holding of its slot.
		if g.unknown[id].IsZero() {
			g.unknown[id] = now
		} else if now.Sub(g.unknown[id]) >= 2*g.cfg.RefreshInterval {
			stale = true
		}
	}
	for id := range g.loads {
		if _, ok := g.members[id]; !ok {
			delete(g.loads, id)
		}
	}
	for id := range g.unknown {
		if _, ok := g.members[id]; !ok {
			delete(g.unknown, id)
		}
	}
	lo, hi := g.shareLocked()
	sum := g.load
	for _, k := range g.loads {
		sum += k
	}
	short := sum < len(g.jobs)
	switch {
	case !short:
		g.short = time.Time{}
	case g.short.IsZero():
		g.short = now
	}
	free := 0 // leases we have seen free
	for _, j := range g.jobs {
		if j.term == nil && !j.freeSince.IsZero() {
			free++
		}
	}
	// An eager instance reads every lease until it knows of enough free
	// ones to reach its share: one it knows of may be one it cannot win,
	// and leases shed to it are found only so.
	full := stale ||
		g.load < lo && free < lo-g.load ||
		short && free == 0 && g.load < hi && now.Sub(g.short) >= g.cfg.RefreshInterval ||
		short && now.Sub(g.short) >= g.cfg.ShedAfter
	// The leases this instance must follow up, and, when it reads in
	// full, a random sample of the others not led, sized to find twice
	// its share, 2 × ceil(L/N), if the leases the published loads leave
	// unaccounted for are free: at a start, when most are, about that
	// many a refresh, so that the N instances together read every lease
	// about twice a refresh, not N times; once few are (after a leave,
	// say), all of them. Sizing it by what the instance lacks instead
	// would miss the leases a leaver's standbys resigned, which an
	// instance at its share then takes after ShedAfter and sheds on. A sample that finds no free lease
	// doubles the next one (loads not yet published make the unaccounted
	// look more than they are), and one that finds some resets it. What
	// the sample misses keeps its last known holder.
	var names, others []string
	for name, j := range g.jobs {
		switch {
		case j.term != nil:
		case j.unsure || !j.freeSince.IsZero():
			names = append(names, name)
		case full:
			others = append(others, name)
		}
	}
	budget := len(others)
	switch unaccounted := len(g.jobs) - sum; {
	case g.load >= hi:
		// At its share or above, the instance reads only as the safety
		// net (the shortfall has lasted ShedAfter): 2 × ceil(L/N) a
		// refresh finds a lease that nobody below the share takes, in a
		// few refreshes. Every instance reading every lease each refresh
		// while a few leases were in flight was more than etcd served at
		// 20 × 2,000: the reads timed out, so nobody learned anything.
		budget = min(budget, 2*hi)
	case unaccounted > 0:
		budget = min(budget, max(2*hi*len(others)/unaccounted+1, g.sample))
	}
	if g.readCap > 0 {
		budget = min(budget, g.readCap)
	}
	sampled := len(others) > budget
	if sampled {
		rand.Shuffle(len(others), func(a, b int) { others[a], others[b] = others[b], others[a] })
		others = others[:budget]
	}
	names = append(names, others...)
	g.mu.Unlock()

	var holders []string
	var errs []error
	if len(names) > 0 {
		holders, errs = g.leaders(ctx, names)
		if ctx.Err() != nil {
			return
		}
		if err := summarize(errs); err != nil {
			g.log.Warn("reading lease holders failed; keeping their last known holders", "err", err)
		}
	}
	// A sample the backend did not answer in time caps the next one at
	// half of what it answered (at least ceil(L/N)); a sample answered
	// whole doubles the cap, until it lifts: reads that time out teach
	// nothing, and cost the backend as much as those that do not.
	answered, failed := 0, false
	for _, err := range errs {
		if err == nil {
			answered++
		} else {
			failed = true
		}
	}

	now = time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	changed := false // a job's stance may have changed
	foundFree := false
	for i, name := range names {
		j := g.jobs[name]
		if j == nil || j.term != nil || errs[i] != nil {
			continue
		}
		if j.unsure {
			j.unsure, changed = false, true
		}
		j.holder = holders[i]
		if g.liveOtherLocked(j.holder) {
			if !j.freeSince.IsZero() {
				j.freeSince, j.freeReads, changed = time.Time{}, 0, true
			}
			continue
		}
		foundFree = true
		if j.freeSince.IsZero() {
			j.freeSince, changed = now, true
		}
		if j.freeReads++; j.freeReads == 2 {
			changed = true
		}
	}
	switch {
	case failed:
		g.readCap = max(hi, answered/2)
	case g.readCap > 0 && len(others) > 0:
		if g.readCap *= 2; g.readCap >= len(g.jobs) {
			g.readCap = 0
		}
	}
	switch {
	case full && sampled && !foundFree && g.load < hi:
		g.sample = 2 * budget
	case !full || foundFree:
		g.sample = 0
	}
	counts := map[string]int{}
	for id := range g.members {
		if id != g.cfg.Candidate.ID {
			counts[id] = g.loads[id]
		}
	}
	if full {
		// A member whose load is unknown is counted by the scan.
		scanned := map[string]int{}
		for _, j := range g.jobs {
			if j.term == nil && g.liveOtherLocked(j.holder) {
				scanned[j.holder]++
			}
		}
		for id := range counts {
			if _, ok := g.loads[id]; !ok {
				counts[id] = scanned[id]
			}
		}
	}
	g.counts = counts
	eager := false
	for id := range counts {
		if _, known := g.loads[id]; known && counts[id] < lo {
			eager = true
		}
	}
	if eager != g.eagerOthers {
		g.eagerOthers, changed = eager, true
	}

	// Judge our recent sheds: did the lease go to somebody less loaded?
	for name, after := range g.sheds {
		j := g.jobs[name]
		switch {
		case j == nil:
			delete(g.sheds, name)
		case j.term != nil:
			g.shedResult(name, false) // back with us
		case !j.unsure && g.liveOtherLocked(j.holder):
			g.shedResult(name, counts[j.holder] <= after)
		}
	}
	if changed {
		g.broadcastLocked()
	}
}

// liveOtherLocked reports whether id is another instance holding a member
// slot: a holder that is alive as far as the group can tell. It goes by the
// last scan, not by the view acted on, which may be a refresh older.
func (g *Group) liveOtherLocked(id string) bool {
	if id == "" || id == g.cfg.Candidate.ID {
		return false
	}
	_, ok := g.scanned[id]
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

	// The members a shed lease should go to.
	below := lo
	if k > hi {
		below = hi
	}
	var held []*job
	toward := map[*job]bool{} // a member below its share stands by for it
	for _, j := range g.jobs {
		if j.term == nil || j.endLead == nil {
			continue
		}
		held = append(held, j)
		for _, id := range g.ringMembersLocked(j.name) {
			if id != g.cfg.Candidate.ID && g.counts[id] < below {
				toward[j] = true
				break
			}
		}
	}
	// First the leases for which a member below its share stands by: its
	// open campaign takes the lease as soon as it is released, where
	// another lease would go to its standbys, which (at their share)
	// resign it, and reach the member below its share only once that one
	// reads it free. Then newest first: the least work in progress, and
	// the least settled.
	slices.SortFunc(held, func(a, b *job) int {
		if toward[a] != toward[b] {
			if toward[a] {
				return -1
			}
			return 1
		}
		return b.since.Compare(a.since)
	})
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
