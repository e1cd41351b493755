package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton/chaos/internal/record"
)

// The fault kinds.
const (
	// KindKill is kill -9 of the holder's baton; it is restarted after a
	// while.
	KindKill = "kill"
	// KindTerm is SIGTERM to the holder's baton (a graceful stop, with
	// hand-over); it is restarted once it has exited.
	KindTerm = "term"
	// KindStopBaton is SIGSTOP of the holder's baton alone, for longer than
	// the TTL, then SIGCONT: its guard must stop the command by safe-until.
	KindStopBaton = "stop-baton"
	// KindStopTree is SIGSTOP of the holder's whole process tree (baton,
	// guard, command), for longer than the TTL: the paused case, which
	// only fencing covers.
	KindStopTree = "stop-tree"
	// KindCut cuts the holder off from the backend (its proxy; for raft,
	// nftables rules isolating its host from the other members).
	KindCut = "cut"
	// KindSlow adds latency to the holder's link to the backend.
	KindSlow = "slow"
	// KindRestart stops the backend and starts it again with its data (for
	// raft, kill -9 of every member and a restart).
	KindRestart = "restart"
	// KindWipe is KindRestart without the data: the backend comes back
	// empty. It is opt-in.
	KindWipe = "wipe"
	// KindRaftLeader is kill -9 of the raft leader member, holder or not.
	KindRaftLeader = "raft-leader"
	// KindRaftQuorum is kill -9 of two of the three voters at once: the
	// group has no quorum until they are back.
	KindRaftQuorum = "raft-quorum"
	// KindRaftMajority is the loss of the majority for good: kill -9 of two
	// of the three voters, whose machines are gone with their data (as
	// instances that an Auto Scaling group terminated). Static discovery
	// cannot prove the lost voters gone, so the harness acts as the
	// operator: it runs `baton raft recover` against the survivor, as the
	// survivor's ERROR line says, until the survivor accepts; then
	// replacements, with no data, start on the same hosts and join. It is
	// opt-in.
	KindRaftMajority = "raft-majority"
	// KindServerKill is kill -9 of one server of an ensemble (chosen at
	// random, the leader or not); it is restarted with its data after a
	// while.
	KindServerKill = "server-kill"
	// KindServerCut cuts one server of an ensemble off from the other
	// servers and from the candidates, for a while.
	KindServerCut = "server-cut"
	// KindHog is a CPU hog beside the candidates and the backend: busy
	// processes, twice as many as the machine has cores, for 1–3 × TTL. A
	// busy host must cost no lease.
	KindHog = "hog"
	// KindStall is a short SIGSTOP, 100 ms–1 s, as a GC pause or a host
	// that stops scheduling a process would make: of the holder's baton,
	// of its guard, or of both, and on raft also of the raft leader's
	// member (its baton). A stall shorter than the TTL's margin must cost
	// no lease.
	KindStall = "stall"
	// KindFailover is a Sentinel failover of the redis-sentinel backend,
	// one of three ways chosen at random: the replication link cut first
	// (the replica stopped, the primary dropping its link) and the
	// candidates left to acquire and renew on the primary alone for
	// 0.3–1 × TTL, then kill -9 of the primary, so that those writes are
	// really lost; kill -9 of the primary with its replica in sync; or
	// SENTINEL FAILOVER. Sentinel promotes the replica, the old primary
	// comes back empty as its replica, and the fault lasts until the group
	// is whole again.
	KindFailover = "failover"
)

// KindsOf returns every fault kind the backend takes.
func KindsOf(backend string) []string {
	common := []string{KindKill, KindTerm, KindStopBaton, KindStopTree, KindCut, KindHog, KindStall}
	switch backend {
	case "raft":
		return append(common, KindRaftLeader, KindRaftQuorum, KindRestart, KindWipe, KindRaftMajority)
	case "zookeeper-ensemble":
		return append(common, KindServerKill, KindServerCut, KindRestart)
	case "redis-sentinel":
		// The candidates dial the servers the sentinels name: no proxy
		// to cut or slow one alone.
		return append(slices.DeleteFunc(common, func(k string) bool { return k == KindCut }), KindFailover)
	}
	return append(common, KindSlow, KindRestart, KindWipe)
}

// DefaultKinds returns the kinds a run injects unless told otherwise: all
// the backend takes but KindWipe and KindRaftMajority.
func DefaultKinds(backend string) []string {
	return slices.DeleteFunc(KindsOf(backend), func(k string) bool { return k == KindWipe || k == KindRaftMajority })
}

// TurnsKinds returns kinds without those a run with several candidates
// per process (Config.Turns) cannot take: stop-baton and stall, which
// stop a baton apart from its guard, where the work runs in the
// candidate's process with no guard (stop-tree is its paused case).
func TurnsKinds(kinds []string) []string {
	return slices.DeleteFunc(slices.Clone(kinds), func(k string) bool { return k == KindStopBaton || k == KindStall })
}

// draw is one injection's random numbers, always drawn in the same order,
// so that a seed gives the same schedule whatever happens in the run.
type draw struct {
	wait       time.Duration
	kind       string
	u, v, w, x float64
}

// rng returns the nemesis's random source for the run's seed.
func (h *Harness) rng() *rand.Rand {
	return rand.New(rand.NewPCG(uint64(h.cfg.Seed), 0x6261746f6e2d6368))
}

// next draws the next injection.
func (h *Harness) next(rng *rand.Rand, kinds []string) draw {
	return draw{
		wait: time.Duration(rng.ExpFloat64() * float64(h.cfg.Interval)),
		kind: kinds[rng.IntN(len(kinds))],
		u:    rng.Float64(), v: rng.Float64(), w: rng.Float64(), x: rng.Float64(),
	}
}

// nemesis injects cfg.Faults faults and waits for all of them to heal.
func (h *Harness) nemesis(ctx context.Context) error {
	kinds := h.cfg.Kinds
	if len(kinds) == 0 {
		kinds = DefaultKinds(h.cfg.Backend)
		if h.cfg.Turns > 1 {
			kinds = TurnsKinds(kinds)
		}
	}
	rng := h.rng()
	slots := make(chan struct{}, h.cfg.MaxActive)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	injected, skipped := 0, 0
	for injected < h.cfg.Faults {
		d := h.next(rng, kinds)
		t := time.NewTimer(d.wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case err := <-errc:
			t.Stop()
			return err
		case <-t.C:
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		}
		heal, f, ok := h.inject(d)
		if !ok {
			<-slots
			skipped++
			continue
		}
		injected++
		if injected%50 == 0 || injected == h.cfg.Faults {
			h.log.Info("faults injected", "n", injected, "of", h.cfg.Faults, "skipped", skipped, "at", h.now().Round(time.Second))
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := heal(); err != nil {
				select {
				case errc <- fmt.Errorf("fault %d (%s on %s): %w", f, d.kind, h.faultTarget(f), err):
				default:
				}
			}
			h.ended(f)
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	return nil
}

// begin records a fault as injected now and returns its id.
func (h *Harness) begin(kind, target string, holder *candidate, paused bool, note string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := record.Fault{ID: len(h.faults) + 1, Kind: kind, Target: target, Start: h.now(), Paused: paused, Note: note}
	f.End = f.Start
	if holder != nil {
		f.Holder = holder.id
	}
	h.faults = append(h.faults, f)
	return f.ID
}

// ended records fault id as healed now.
func (h *Harness) ended(id int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults[id-1].End = h.now()
}

func (h *Harness) faultTarget(id int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.faults[id-1].Target
}

// pick claims the candidate a fault of this kind hits: the holder four
// times in five (if it is free), else a free candidate chosen by u. It
// returns nil if none is free.
func (h *Harness) pick(u, v float64) *candidate {
	if c := h.holder(); c != nil && v < 0.8 && c.claim() {
		return c
	}
	var free []*candidate
	for _, c := range h.cands {
		if pid, _ := c.proc(); pid != 0 && !c.isBusy() {
			free = append(free, c)
		}
	}
	if len(free) == 0 {
		return nil
	}
	c := free[int(u*float64(len(free)))%len(free)]
	if !c.claim() {
		return nil
	}
	return c
}

// inject injects the fault d names, and returns what heals it (blocking
// for the fault's duration first) and the fault's id; ok is false if the
// fault had no target free at this moment.
func (h *Harness) inject(d draw) (heal func() error, id int, ok bool) {
	ttl := h.cfg.TTL
	scale := func(lo, hi float64) time.Duration { return time.Duration((lo + (hi-lo)*d.u) * float64(ttl)) }
	holder := h.holder()
	switch d.kind {
	case KindKill, KindTerm, KindStopBaton, KindStopTree, KindCut, KindSlow:
		c := h.pick(d.w, d.v)
		if c == nil {
			return nil, 0, false
		}
		switch d.kind {
		case KindKill:
			down := scale(0.2, 1)
			id := h.begin(d.kind, c.id, holder, false, "")
			c.stop(syscall.SIGKILL, 10*time.Second)
			return func() error { defer c.release(); time.Sleep(down); return c.start() }, id, true
		case KindTerm:
			down := scale(0.1, 0.5)
			id := h.begin(d.kind, c.id, holder, false, "")
			return func() error {
				defer c.release()
				if !c.stop(syscall.SIGTERM, ttl+30*time.Second) {
					h.log.Warn("candidate did not exit within TTL+30s of SIGTERM; killed", "candidate", c.id)
				}
				time.Sleep(down)
				return c.start()
			}, id, true
		case KindStopBaton, KindStopTree:
			hold := scale(1.2, 2.5)
			pid, _ := c.proc()
			if pid == 0 {
				c.release()
				return nil, 0, false
			}
			tree := d.kind == KindStopTree
			id := h.begin(d.kind, c.id, holder, tree, fmt.Sprintf("stopped %s", hold.Round(time.Millisecond)))
			pids := []int{pid}
			if tree {
				pids = stopTree(pid)
			} else {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
			}
			return func() error {
				defer c.release()
				time.Sleep(hold)
				contTree(pids)
				return nil
			}, id, true
		case KindCut:
			hold := scale(0.5, 2.5)
			id := h.begin(d.kind, c.id, holder, false, fmt.Sprintf("cut %s", hold.Round(time.Millisecond)))
			if err := h.be.cut(c.i); err != nil {
				return func() error { c.release(); return err }, id, true
			}
			return func() error { defer c.release(); time.Sleep(hold); return h.be.heal(c.i) }, id, true
		case KindSlow:
			hold := scale(1, 3)
			lat := time.Duration(50+450*d.x) * time.Millisecond
			id := h.begin(d.kind, c.id, holder, false, fmt.Sprintf("+%s for %s", lat, hold.Round(time.Millisecond)))
			if err := h.be.slow(c.i, lat); err != nil {
				return func() error { c.release(); return err }, id, true
			}
			return func() error { defer c.release(); time.Sleep(hold); return h.be.slow(c.i, 0) }, id, true
		}
	case KindRaftLeader:
		h.mu.Lock()
		i := h.raftLeader
		h.mu.Unlock()
		if i < 0 || !h.cands[i].claim() {
			return nil, 0, false
		}
		c := h.cands[i]
		if pid, _ := c.proc(); pid == 0 {
			c.release()
			return nil, 0, false
		}
		down := scale(0.2, 1)
		id := h.begin(d.kind, c.id, holder, false, "")
		h.setRaftLeader(-1)
		c.stop(syscall.SIGKILL, 10*time.Second)
		return func() error { defer c.release(); time.Sleep(down); return c.start() }, id, true
	case KindRaftQuorum:
		var two []*candidate
		for _, k := range []int{int(d.w * 3), int(d.w*3) + 1} {
			c := h.cands[k%3]
			if !c.claim() {
				for _, o := range two {
					o.release()
				}
				return nil, 0, false
			}
			two = append(two, c)
		}
		down := scale(1, 2.5)
		id := h.begin(d.kind, two[0].id+","+two[1].id, holder, false, fmt.Sprintf("down %s", down.Round(time.Millisecond)))
		var wg sync.WaitGroup
		for _, c := range two {
			wg.Go(func() { c.stop(syscall.SIGKILL, 10*time.Second) })
		}
		wg.Wait()
		return func() error {
			defer func() {
				for _, c := range two {
					c.release()
				}
			}()
			time.Sleep(down)
			for _, c := range two {
				if err := c.start(); err != nil {
					return err
				}
			}
			return nil
		}, id, true
	case KindRaftMajority:
		return h.loseMajority(d, holder)
	case KindRestart, KindWipe:
		return h.restart(d, holder, scale(0.2, 1)+500*time.Millisecond)
	case KindHog:
		return h.hog(d, holder, scale(1, 3))
	case KindStall:
		return h.stall(d, holder, time.Duration(100+900*d.u)*time.Millisecond)
	case KindServerKill:
		return h.killServer(d, holder, scale(0.5, 2))
	case KindServerCut:
		return h.cutServer(d, holder, scale(0.5, 2.5))
	case KindFailover:
		return h.failover(d, holder, scale(0.3, 1))
	}
	return nil, 0, false
}

// claimBackend marks the backend under a fault unless it already is; it
// reports whether it did. One backend-wide fault at a time.
func (h *Harness) claimBackend() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.backendBusy {
		return false
	}
	h.backendBusy = true
	return true
}

func (h *Harness) releaseBackend() {
	h.mu.Lock()
	h.backendBusy = false
	h.mu.Unlock()
}

// restart stops the backend (wiping its data for KindWipe) for down, and
// starts it again. On raft, where the candidates are the backend, it kills
// and restarts every candidate.
func (h *Harness) restart(d draw, holder *candidate, down time.Duration) (func() error, int, bool) {
	wipe := d.kind == KindWipe
	if !h.claimBackend() {
		return nil, 0, false
	}
	done := h.releaseBackend
	if !h.be.members() {
		id := h.begin(d.kind, "backend", holder, false, fmt.Sprintf("down %s", down.Round(time.Millisecond)))
		err := h.be.down(wipe)
		return func() error {
			defer done()
			if err != nil {
				return err
			}
			time.Sleep(down)
			return h.be.up()
		}, id, true
	}
	var claimed []*candidate
	for _, c := range h.cands {
		if !c.claim() {
			for _, o := range claimed {
				o.release()
			}
			done()
			return nil, 0, false
		}
		claimed = append(claimed, c)
	}
	id := h.begin(d.kind, "backend", holder, false, fmt.Sprintf("every member down %s", down.Round(time.Millisecond)))
	var wg sync.WaitGroup
	for _, c := range h.cands {
		wg.Go(func() { c.stop(syscall.SIGKILL, 10*time.Second) })
	}
	wg.Wait()
	h.setRaftLeader(-1)
	err := h.be.down(wipe)
	return func() error {
		defer done()
		defer func() {
			for _, c := range claimed {
				c.release()
			}
		}()
		if err != nil {
			return err
		}
		time.Sleep(down)
		for _, c := range h.cands {
			if err := c.start(); err != nil {
				return err
			}
		}
		return nil
	}, id, true
}

// failover injects KindFailover on a backend that takes it; lose is how
// long the candidates write to the primary alone when the replication
// link is cut first.
func (h *Harness) failover(d draw, holder *candidate, lose time.Duration) (func() error, int, bool) {
	fo, ok := h.be.(failoverer)
	if !ok || !h.claimBackend() {
		return nil, 0, false
	}
	how := failoverHow(int(d.x*3) % 3)
	note := how.String()
	if how == failoverLosing {
		note = fmt.Sprintf("replication cut for %s, then kill -9 of the primary", lose.Round(time.Millisecond))
	}
	id := h.begin(d.kind, "primary", holder, false, note)
	return func() error {
		defer h.releaseBackend()
		return fo.failover(how, lose)
	}, id, true
}

// ensemble is a backend of several servers, one of which a fault can kill.
type ensemble interface {
	servers() int
	// killServer kills server i with SIGKILL; startServer starts it again
	// with its data.
	killServer(i int) error
	startServer(i int) error
	// cutServer cuts server i off from the other servers and from the
	// candidates, until healServer(i).
	cutServer(i int) error
	healServer(i int) error
}

// killServer kills one server of an ensemble for down, then restarts it.
func (h *Harness) killServer(d draw, holder *candidate, down time.Duration) (func() error, int, bool) {
	return h.serverFault(d, holder, down, func(e ensemble, i int) error { return e.killServer(i) },
		func(e ensemble, i int) error { return e.startServer(i) })
}

// cutServer cuts one server of an ensemble off for hold, then heals it.
func (h *Harness) cutServer(d draw, holder *candidate, hold time.Duration) (func() error, int, bool) {
	return h.serverFault(d, holder, hold, func(e ensemble, i int) error { return e.cutServer(i) },
		func(e ensemble, i int) error { return e.healServer(i) })
}

// serverFault injects a fault into one server of an ensemble, chosen by
// d.w, and undoes it after hold.
func (h *Harness) serverFault(d draw, holder *candidate, hold time.Duration, do, undo func(ensemble, int) error) (func() error, int, bool) {
	e, ok := h.be.(ensemble)
	if !ok {
		return nil, 0, false
	}
	if !h.claimBackend() {
		return nil, 0, false
	}
	i := int(d.w*float64(e.servers())) % e.servers()
	id := h.begin(d.kind, fmt.Sprintf("server %d", i+1), holder, false, fmt.Sprintf("for %s", hold.Round(time.Millisecond)))
	err := do(e, i)
	return func() error {
		defer h.releaseBackend()
		if err != nil {
			return err
		}
		time.Sleep(hold)
		return undo(e, i)
	}, id, true
}

// loseMajority injects KindRaftMajority: every candidate is claimed (the
// survivor must stay up to be recovered), two are killed for good and
// replaced, and the heal is the operator's `baton raft recover`.
func (h *Harness) loseMajority(d draw, holder *candidate) (heal func() error, id int, ok bool) {
	rb, isRaft := h.be.(*raftBackend)
	if !isRaft || len(h.cands) != 3 {
		return nil, 0, false
	}
	var claimed []*candidate
	release := func() {
		for _, c := range claimed {
			c.release()
		}
	}
	for _, c := range h.cands {
		if !c.claim() {
			release()
			return nil, 0, false
		}
		claimed = append(claimed, c)
	}
	// Only a whole group loses its majority: each member must have logged
	// three voters (an earlier fault may have left one out, or rejoining).
	for _, c := range claimed {
		if c.voterCount() != 3 {
			release()
			return nil, 0, false
		}
	}
	k := int(d.w*3) % 3
	survivor := h.cands[k]
	lost := []*candidate{h.cands[(k+1)%3], h.cands[(k+2)%3]}
	id = h.begin(d.kind, lost[0].id+","+lost[1].id, holder, false, "survivor "+survivor.id)
	var wg sync.WaitGroup
	for _, c := range lost {
		wg.Go(func() { c.stop(syscall.SIGKILL, 10*time.Second) })
	}
	wg.Wait()
	h.setRaftLeader(-1)
	for _, c := range lost {
		if err := rb.wipe(c.i); err != nil {
			release()
			return func() error { return err }, id, true
		}
	}
	return func() error {
		defer release()
		// The operator first, then the replacements: a fresh member at a
		// dead voter's address answers a raft leader's appends as that
		// voter would, so a survivor that still led when the others died
		// would keep its quorum through them, and no majority would be
		// lost.
		if err := rb.recoverMember(h.baton, survivor.i, lost[0].i, lost[1].i); err != nil {
			return err
		}
		survivor.forgetVoters()
		for _, c := range lost {
			if err := c.start(); err != nil {
				return err
			}
		}
		// The fault lasts until the group is whole again: the replacements
		// are voters of the recovered group, so that the next fault finds
		// three voters.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if n := survivor.voterCount(); n == 3 && lost[0].voterCount() == 3 && lost[1].voterCount() == 3 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the group was not whole again 2m after the recovery (survivor %s logs %d voters)", survivor.id, survivor.voterCount())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}, id, true
}
