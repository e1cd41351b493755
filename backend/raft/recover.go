package raft

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
	hraft "github.com/hashicorp/raft"
)

// Recovery from a lost majority.
//
// A group whose voters are mostly gone elects no one: raft cannot tell a
// dead voter from one behind a partition, and a minority that went on
// alone could be a second group beside a majority that still lives. A
// member that has had no raft leader for NodeOptions.RecoverAfter asks
// what it can about every member that might still vote (watchQuorum):
//
//   - it probes every member of its latest configuration and every peer
//     that discovery lists, over the group API;
//   - any that knows a raft leader ends the matter: a group lives, and the
//     membership loop joins it;
//   - every member that does not answer must be proven gone for good, by
//     NodeOptions.Terminations (the aws package: EC2 reports its instance
//     terminated, asked afresh). A member that is merely silent, stopped,
//     detached or Terminating could be a live group's voter behind a
//     partition: no recovery, whatever else holds;
//   - the voters of the configuration that answered (with this member)
//     must be fewer than its quorum: else they can still elect;
//   - of the members that answered, only the one with the most advanced
//     log (last term, then last index, then lowest ID) acts. Its log holds
//     every entry that a live member could have seen committed, the latest
//     configuration among them.
//
// That member then restarts its raft in-process with
// hashicorp/raft's RecoverCluster, on a configuration of itself alone: no
// other member need agree on anything, and the others join it as any
// member joins (the join loop that waited for a leader finds one), and
// autopilot makes them voters. Proven-terminated members never vote again;
// a member that did not answer was proven terminated; every member that
// answered now follows the recovered group or joins it. So no second group
// can form: the old configuration's remaining voters are fewer than its
// quorum, and they refuse votes to a candidate outside their
// configuration.
//
// The recovered member's first act as raft leader, before it serves
// anything, is a recover entry (fsm.recover): a new epoch above the old
// one, since the lost members may have committed grants this log lacks,
// and no sessions or leases. Then it grants nothing for the hold
// (MaxTTL plus half a heartbeat timeout, from the decision): a holder whose
// renewal the lost members confirmed, and that this log never saw, has
// passed its safe-until by then, since no renewal can be confirmed after
// the members that confirm it are terminated, which was before the
// decision. A hold-over entry then opens the group; a raft leader elected
// during the hold waits a full hold from its own election.
//
// Where nothing can prove the lost members gone (static or DNS discovery,
// or members that are only silent), the member says so at Error, once per
// recoverLogEvery, with the one command that recovers it (`baton raft
// recover`, served by serveRecover): the operator's word replaces the
// proof.

// Terminations proves which members are gone for good: the aws package's
// ASG, from EC2's instance states. Members that lost their quorum ask it
// (see NodeOptions.Terminations).
type Terminations interface {
	// Place is called with the addresses of the configuration's members
	// (host:port) while they run and whenever the configuration changes,
	// so that Terminated can later name what they ran on.
	Place(ctx context.Context, addrs []string) error
	// Terminated reports, of addrs, those whose machine is proven gone
	// for good now (an EC2 instance in state terminated), each with a
	// reason. It must not answer from a cache: a member acts on it.
	Terminated(ctx context.Context, addrs []string) (map[string]string, error)
}

// DefaultMaxTTL is NodeOptions.MaxTTL when it is zero.
const DefaultMaxTTL = 30 * time.Second

// placeRetry is how long a member waits to call Terminations.Place again
// after it could not place every member.
const placeRetry = 10 * time.Second

// recoverLogEvery is how often a member that lost its quorum and cannot
// recover on its own repeats why, at Error.
const recoverLogEvery = 30 * time.Second

// raftHandle is the member's current hashicorp/raft instance: a recovery
// replaces it in place, while the rest of the member keeps calling it.
// Safe for concurrent use.
type raftHandle struct{ p atomic.Pointer[hraft.Raft] }

func (h *raftHandle) get() *hraft.Raft  { return h.p.Load() }
func (h *raftHandle) set(r *hraft.Raft) { h.p.Store(r) }

func (h *raftHandle) AddNonvoter(id hraft.ServerID, addr hraft.ServerAddress, prev uint64, t time.Duration) hraft.IndexFuture {
	return h.get().AddNonvoter(id, addr, prev, t)
}
func (h *raftHandle) AddVoter(id hraft.ServerID, addr hraft.ServerAddress, prev uint64, t time.Duration) hraft.IndexFuture {
	return h.get().AddVoter(id, addr, prev, t)
}
func (h *raftHandle) DemoteVoter(id hraft.ServerID, prev uint64, t time.Duration) hraft.IndexFuture {
	return h.get().DemoteVoter(id, prev, t)
}
func (h *raftHandle) RemoveServer(id hraft.ServerID, prev uint64, t time.Duration) hraft.IndexFuture {
	return h.get().RemoveServer(id, prev, t)
}
func (h *raftHandle) AppliedIndex() uint64 { return h.get().AppliedIndex() }
func (h *raftHandle) Apply(cmd []byte, t time.Duration) hraft.ApplyFuture {
	return h.get().Apply(cmd, t)
}
func (h *raftHandle) Barrier(t time.Duration) hraft.Future { return h.get().Barrier(t) }
func (h *raftHandle) BootstrapCluster(c hraft.Configuration) hraft.Future {
	return h.get().BootstrapCluster(c)
}
func (h *raftHandle) CurrentTerm() uint64                         { return h.get().CurrentTerm() }
func (h *raftHandle) GetConfiguration() hraft.ConfigurationFuture { return h.get().GetConfiguration() }
func (h *raftHandle) LastContact() time.Time                      { return h.get().LastContact() }
func (h *raftHandle) LastIndex() uint64                           { return h.get().LastIndex() }
func (h *raftHandle) Leader() hraft.ServerAddress                 { return h.get().Leader() }
func (h *raftHandle) LeaderWithID() (hraft.ServerAddress, hraft.ServerID) {
	return h.get().LeaderWithID()
}
func (h *raftHandle) LeadershipTransfer() hraft.Future { return h.get().LeadershipTransfer() }
func (h *raftHandle) LeadershipTransferToServer(id hraft.ServerID, addr hraft.ServerAddress) hraft.Future {
	return h.get().LeadershipTransferToServer(id, addr)
}
func (h *raftHandle) Shutdown() hraft.Future     { return h.get().Shutdown() }
func (h *raftHandle) State() hraft.RaftState     { return h.get().State() }
func (h *raftHandle) Stats() map[string]string   { return h.get().Stats() }
func (h *raftHandle) VerifyLeader() hraft.Future { return h.get().VerifyLeader() }

// keptTransport is the transport as each raft instance sees it: without
// Close, so that shutting one instance down for a recovery leaves the
// member's connections and listener to the next. Node.shutdown closes the
// transport itself.
type keptTransport struct{ raftTransport }

type raftTransport interface {
	hraft.Transport
	hraft.WithPreVote
}

// recoveryState is what the member knows of a recovery it made, and of the
// quorum watch's view; guarded by Node.recMu.
type recoveryState struct {
	// decided is when this member decided to recover (zero: it did not);
	// hold and reason go with it, for the recover entry.
	decided time.Time
	hold    time.Duration
	reason  string
	// proposed is set once this member's recover entry is committed.
	proposed bool

	leaderless time.Time            // since when no raft leader is known (zero: one is)
	answered   map[string]time.Time // member ID -> last answer to a quorum probe
	lastLog    time.Time            // last Error about the lost quorum
	lastWhy    string               // what it said
	placedConf string               // the configuration last placed in full by Terminations.Place
	placeAfter time.Time            // when to ask Place again after it could not place everyone
}

// watchQuorum runs for the member's life: it notes when the member has no
// raft leader, and after RecoverAfter of it, looks every DeparturesEvery at
// whether the group can recover (assess).
func (n *Node) watchQuorum() {
	defer n.wg.Done()
	tick := time.NewTicker(max(n.opts.HeartbeatTimeout/2, 250*time.Millisecond))
	defer tick.Stop()
	var assessed time.Time
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		addr, _ := n.raft.LeaderWithID()
		n.recMu.Lock()
		if addr != "" {
			n.rec.leaderless = time.Time{}
		} else if n.rec.leaderless.IsZero() {
			n.rec.leaderless = now
		}
		since := n.rec.leaderless
		n.recMu.Unlock()
		if addr != "" {
			n.placeConfiguration()
			continue
		}
		// A member with no log was never in a group: nothing to recover.
		if n.raft.LastIndex() == 0 || now.Sub(since) < n.opts.RecoverAfter || now.Sub(assessed) < n.opts.DeparturesEvery {
			continue
		}
		assessed = now
		a := n.assess(n.ctx)
		if a.act && n.opts.Terminations != nil {
			if err := n.recoverAlone(a.summary(), true); err != nil && n.ctx.Err() == nil {
				n.log.Error("could not recover the group", "err", err)
			}
			continue
		}
		n.reportLostQuorum(a)
	}
}

// placeConfiguration hands the configuration's addresses to
// Terminations.Place when the configuration changed since the last time.
func (n *Node) placeConfiguration() {
	if n.opts.Terminations == nil {
		return
	}
	servers, ok := n.configServers()
	if !ok {
		return
	}
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, string(s.Address))
	}
	slices.Sort(addrs)
	key := strings.Join(addrs, ",")
	n.recMu.Lock()
	skip := n.rec.placedConf == key || time.Now().Before(n.rec.placeAfter)
	n.recMu.Unlock()
	if skip {
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, departuresCallTimeout)
	err := n.opts.Terminations.Place(ctx, addrs)
	cancel()
	n.recMu.Lock()
	defer n.recMu.Unlock()
	if err != nil {
		// A member whose machine was just launched is placed by a later
		// refresh; one outside the platform never is, and costs a call
		// per placeRetry.
		n.log.Debug("could not place every member's machine yet", "err", err)
		n.rec.placeAfter = time.Now().Add(placeRetry)
		return
	}
	n.rec.placedConf, n.rec.placeAfter = key, time.Time{}
}

// lostMember is a member that did not answer a quorum probe.
type lostMember struct {
	ID     string
	Addr   string
	Voter  bool
	Since  time.Time // last heard: a leader or an answer
	Proven string    // why it is gone for good; empty when not proven
}

// assessment is what a member without a raft leader learnt about whether
// its group can recover.
type assessment struct {
	voters, quorum, live int // the configuration's voters, its quorum, the voters that answered (this member too)
	lost                 []lostMember
	best                 nodeInfo // the answering member (this one too) with the most advanced log
	lostQuorum           bool     // the voters that answer are fewer than the quorum
	why                  string   // why not recover now; empty with act
	act                  bool     // every condition holds (the proof too) and this member is the one to act
	wait                 bool     // another member is to act, or the group needs no recovery
}

func (a assessment) summary() string {
	var parts []string
	for _, l := range a.lost {
		why := l.Proven
		if why == "" {
			why = "no proof it is gone"
		}
		parts = append(parts, fmt.Sprintf("%s (%s): %s", l.ID, l.Addr, why))
	}
	return fmt.Sprintf("%d of %d voters answer, below the quorum of %d; lost: %s", a.live, a.voters, a.quorum, strings.Join(parts, "; "))
}

// assess probes the members and discovery's peers and decides whether this
// member recovers the group now (see the top of this file). With
// Terminations nil, act means: every condition but the proof holds.
func (n *Node) assess(ctx context.Context) assessment {
	a := assessment{best: nodeInfo{ID: n.id, Addr: n.addr}}
	servers, ok := n.configServers()
	if !ok {
		return assessment{wait: true, why: "the configuration is unreadable"}
	}
	self := slices.IndexFunc(servers, func(s hraft.Server) bool { return string(s.ID) == n.id })
	if self < 0 {
		return assessment{wait: true, why: "this member is not in its configuration: it joins a group instead"}
	}
	addrs := map[string]bool{}
	for _, s := range servers {
		if s.Suffrage == hraft.Voter {
			a.voters++
		}
		if string(s.ID) != n.id {
			addrs[string(s.Address)] = true
		}
	}
	a.quorum = a.voters/2 + 1
	peers, derr := n.discover()
	for _, p := range peers {
		addrs[p] = true
	}
	infos := n.probeAll(ctx, slices.Sorted(mapKeys(addrs)))
	byID := map[string]nodeInfo{}
	for _, in := range infos {
		byID[in.ID] = in
		if in.Leader != "" {
			return assessment{wait: true, why: fmt.Sprintf("%s (%s) knows a raft leader, %s: a group lives", in.ID, in.Addr, in.LeaderID)}
		}
	}
	now := time.Now()
	n.recMu.Lock()
	if n.rec.answered == nil {
		n.rec.answered = map[string]time.Time{}
	}
	for _, in := range infos {
		n.rec.answered[in.ID] = now
	}
	leaderless := n.rec.leaderless
	answered := maps.Clone(n.rec.answered)
	n.recMu.Unlock()

	a.best.LastIndex, a.best.LastTerm = n.lastLog()
	var missing []string
	for _, s := range servers {
		id := string(s.ID)
		if id == n.id {
			if s.Suffrage == hraft.Voter {
				a.live++
			}
			continue
		}
		if _, ok := byID[id]; ok {
			if s.Suffrage == hraft.Voter {
				a.live++
			}
			continue
		}
		since := leaderless
		if t := answered[id]; t.After(since) {
			since = t
		}
		a.lost = append(a.lost, lostMember{ID: id, Addr: string(s.Address), Voter: s.Suffrage == hraft.Voter, Since: since})
		missing = append(missing, string(s.Address))
	}
	// A peer that discovery lists and that does not answer may be a member
	// of a configuration this member never saw.
	for _, p := range peers {
		if _, ok := infos[p]; !ok && !slices.Contains(missing, p) {
			a.lost = append(a.lost, lostMember{ID: "(a discovered peer)", Addr: p, Since: leaderless})
			missing = append(missing, p)
		}
	}
	for _, in := range infos {
		if in.HasState && (in.LastTerm > a.best.LastTerm || in.LastTerm == a.best.LastTerm && in.LastIndex > a.best.LastIndex ||
			in.LastTerm == a.best.LastTerm && in.LastIndex == a.best.LastIndex && in.ID < a.best.ID) {
			a.best = in
		}
	}
	if a.live >= a.quorum {
		a.wait, a.why = true, fmt.Sprintf("%d of %d voters answer, a quorum: they can elect a leader", a.live, a.voters)
		return a
	}
	a.lostQuorum = true
	if a.best.ID != n.id {
		a.wait, a.why = true, fmt.Sprintf("%s (%s) has the most advanced log (term %d, index %d): it is the member to recover", a.best.ID, a.best.Addr, a.best.LastTerm, a.best.LastIndex)
		return a
	}
	if derr != nil {
		a.why = fmt.Sprintf("discovery failed (%v): a peer it would list may be a live group's member", derr)
		return a
	}
	if n.opts.Terminations == nil {
		a.why = "nothing here can prove that the lost members are gone for good: their machines may only be cut off (static and DNS discovery prove nothing; with --join aws-asg, EC2 does)"
	} else if len(missing) > 0 {
		cctx, cancel := context.WithTimeout(ctx, departuresCallTimeout)
		proven, err := n.opts.Terminations.Terminated(cctx, missing)
		cancel()
		if err != nil {
			a.why = fmt.Sprintf("could not ask whether the lost members' machines are terminated: %v", err)
			return a
		}
		var unproven []string
		for i, l := range a.lost {
			if r, ok := proven[l.Addr]; ok {
				a.lost[i].Proven = r
			} else {
				unproven = append(unproven, l.Addr)
			}
		}
		if len(unproven) > 0 {
			a.why = fmt.Sprintf("%s did not answer and %s not proven terminated (EC2 state terminated, asked now): a machine that is cut off, stopped, detached or still terminating may run a live group's member",
				strings.Join(unproven, ", "), plural(len(unproven), "is", "are"))
			return a
		}
	}
	if n.opts.Terminations != nil {
		a.act = true
	}
	return a
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// probeAll asks each address for its member info, in parallel, within a
// heartbeat timeout (at least a second).
func (n *Node) probeAll(ctx context.Context, addrs []string) map[string]nodeInfo {
	var mu sync.Mutex
	out := map[string]nodeInfo{}
	var wg sync.WaitGroup
	for _, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, max(n.opts.HeartbeatTimeout, time.Second))
			defer cancel()
			var in nodeInfo
			if err := n.client.call(cctx, addr, "/v1/raft/info", nil, &in, false); err == nil && in.ID != n.id {
				mu.Lock()
				out[addr] = in
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// reportLostQuorum says at Error, at most once per recoverLogEvery unless
// what it says changes, that the group lost its quorum and why this member
// does not recover it, with the command that does.
func (n *Node) reportLostQuorum(a assessment) {
	if !a.lostQuorum {
		n.log.Debug("no raft leader; no recovery needed", "why", a.why)
		return
	}
	var lost, voters []string
	for _, l := range a.lost {
		if !l.Voter {
			continue
		}
		voters = append(voters, l.Addr)
		lost = append(lost, fmt.Sprintf("%s at %s (unreachable since %s)", l.ID, l.Addr, l.Since.UTC().Format(time.RFC3339)))
	}
	now := time.Now()
	n.recMu.Lock()
	since := n.rec.leaderless
	repeat := a.why == n.rec.lastWhy && now.Sub(n.rec.lastLog) < recoverLogEvery
	if !repeat {
		n.rec.lastLog, n.rec.lastWhy = now, a.why
	}
	n.recMu.Unlock()
	if repeat {
		return
	}
	attrs := []any{"no_leader_since", since.UTC().Format(time.RFC3339), "lost_voters", strings.Join(lost, "; "),
		"voters", a.voters, "answering", a.live, "quorum", a.quorum, "why", a.why}
	if a.wait {
		// Another member has the more advanced log: it recovers, on its
		// own proof or the operator's word.
		if n.opts.Terminations != nil {
			n.log.Warn("the group has lost its quorum; the member with the most advanced log is to recover it", attrs...)
			return
		}
		command := RecoverCommand(a.best.Addr, voters)
		n.log.Error("the group has lost its quorum, and no member can recover it by itself; if the lost voters are gone for good, run: "+command,
			append(attrs, "command", command)...)
		return
	}
	command := RecoverCommand(n.addr, voters)
	n.log.Error("the group has lost its quorum, and this member will not recover it by itself; if the lost voters are gone for good, run: "+command,
		append(attrs, "command", command)...)
}

// RecoverCommand is the command an operator runs to recover the member at
// member from the loss of the voters at lost: `baton raft recover`, with
// the group's TLS files and secret as the member has them.
func RecoverCommand(member string, lost []string) string {
	lost = slices.Sorted(slices.Values(lost))
	return fmt.Sprintf("baton raft recover --member %s --lost %s (with this member's --tls-* flags and secret)", member, strings.Join(lost, ","))
}

// recoverAlone restarts this member's raft on a configuration of itself
// alone (hashicorp/raft's RecoverCluster), to lead a group that takes a
// new epoch and holds every grant for the hold (see the top of this file).
func (n *Node) recoverAlone(reason string, auto bool) error {
	n.recoverMu.Lock()
	defer n.recoverMu.Unlock()
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return hraft.ErrRaftShutdown
	}
	if addr, _ := n.raft.LeaderWithID(); addr != "" {
		return errors.New("the group has a raft leader again: nothing to recover")
	}
	decided := time.Now()
	hold := n.opts.MaxTTL + n.opts.HeartbeatTimeout/2
	how := "by the operator's word"
	if auto {
		how = "on the proof that the lost members are gone for good"
	}
	n.log.Warn("recovering the group from the loss of its quorum, "+how+": this member restarts its raft as the group's only voter; the others join it; no lease is granted until the hold has passed",
		"reason", reason, "hold", hold)
	conf := hraft.Configuration{Servers: []hraft.Server{{Suffrage: hraft.Voter, ID: hraft.ServerID(n.id), Address: hraft.ServerAddress(n.addr)}}}
	if err := n.raft.get().Shutdown().Error(); err != nil {
		return fmt.Errorf("raft: recover: shut raft down: %w", err)
	}
	n.recMu.Lock()
	n.rec.decided, n.rec.hold, n.rec.reason, n.rec.proposed = decided, hold, reason, false
	n.recMu.Unlock()
	if err := hraft.RecoverCluster(n.raftConf, newFSM(), n.logs, n.stable, n.snaps, n.kept, conf); err != nil {
		// The stores are as they were: raft starts again on them, still
		// without a quorum.
		n.log.Error("RecoverCluster failed; restarting raft on the old configuration", "err", err)
		n.recMu.Lock()
		n.rec.decided = time.Time{}
		n.recMu.Unlock()
		if r, rerr := hraft.NewRaft(n.raftConf, n.fsm, n.logs, n.stable, n.snaps, n.kept); rerr == nil {
			n.raft.set(r)
		}
		return fmt.Errorf("raft: recover: %w", err)
	}
	r, err := hraft.NewRaft(n.raftConf, n.fsm, n.logs, n.stable, n.snaps, n.kept)
	if err != nil {
		return fmt.Errorf("raft: recover: restart raft: %w", err)
	}
	n.raft.set(r)
	return nil
}

// finishRecovery runs on a new raft leader before it serves anything: it
// commits this member's recover entry if it made a recovery, and waits out
// the hold of the last recovery if no hold-over entry followed it. It
// reports false when the term ended first.
func (n *Node) finishRecovery(ctx context.Context) bool {
	n.recMu.Lock()
	rec := n.rec
	n.recMu.Unlock()
	holdFrom := time.Now()
	if !rec.decided.IsZero() && !rec.proposed {
		if _, err := n.applyLocal(command{Op: opRecover, Time: n.now(), Hold: rec.hold}); err != nil {
			n.log.Warn("could not commit the recover entry; not serving", "err", err)
			return false
		}
		n.recMu.Lock()
		n.rec.proposed = true
		n.recMu.Unlock()
		holdFrom = rec.decided
		e := n.fsm.epoch()
		n.log.Warn("group recovered: new epoch, sessions and leases cleared; holding grants",
			"epoch", e, "hold_until", holdFrom.Add(rec.hold).UTC().Format(time.RFC3339Nano), "reason", rec.reason)
	}
	r, ok := n.fsm.recovery()
	if !ok || r.HoldOver {
		return true
	}
	wait := time.Until(holdFrom.Add(r.Hold))
	if wait > 0 {
		n.log.Info("holding every grant after the group's recovery: a holder the lost members confirmed may act until then", "for", wait.Round(time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	if _, err := n.applyLocal(command{Op: opHoldOver, Time: n.now()}); err != nil {
		n.log.Warn("could not end the hold after the recovery; not serving", "err", err)
		return false
	}
	n.log.Info("the hold after the group's recovery passed: granting again")
	return true
}

// recoverRequest is `baton raft recover`'s request (serveRecover).
type recoverRequest struct {
	// Lost are the addresses (host:port) or IDs of the voters the operator
	// knows are gone for good.
	Lost []string `json:"lost"`
}

// RecoverResult is a member's answer to a recovery request.
type RecoverResult struct {
	ID      string `json:"id"`      // the member that recovered
	Addr    string `json:"addr"`    // its address
	Summary string `json:"summary"` // what it found
}

// serveRecover recovers this member on the operator's word: the voters the
// request names are gone for good. It refuses when the group has a leader,
// when a named member is not a voter of the configuration, when the voters
// not named are a quorum (they can elect: start the missing ones), when a
// voter not named does not answer (name it too, if it is gone), or when a
// member that answers has a more advanced log (recover that one).
func (n *Node) serveRecover(w http.ResponseWriter, r *http.Request) {
	var req recoverRequest
	if !readJSON(w, r, &req) {
		return
	}
	refuse := func(status int, format string, args ...any) {
		http.Error(w, fmt.Sprintf(format, args...), status)
	}
	if addr, id := n.raft.LeaderWithID(); addr != "" {
		refuse(http.StatusConflict, "the group has a raft leader, %s at %s: nothing to recover", id, addr)
		return
	}
	servers, ok := n.configServers()
	if !ok {
		refuse(http.StatusInternalServerError, "this member cannot read its configuration")
		return
	}
	named := map[string]bool{}
	for _, l := range req.Lost {
		named[l] = true
	}
	var voters []string
	for _, s := range servers {
		if s.Suffrage != hraft.Voter {
			continue
		}
		voters = append(voters, fmt.Sprintf("%s (%s)", s.ID, s.Address))
		if named[string(s.ID)] || named[string(s.Address)] {
			delete(named, string(s.ID))
			delete(named, string(s.Address))
			if string(s.ID) == n.id {
				refuse(http.StatusBadRequest, "--lost names this member (%s at %s): name the voters that are gone, and run the command against a member that lives", n.id, n.addr)
				return
			}
		}
	}
	if len(named) > 0 {
		refuse(http.StatusBadRequest, "--lost names %s, not a voter of this member's configuration; its voters are %s", strings.Join(slices.Sorted(mapKeys(named)), ", "), strings.Join(voters, ", "))
		return
	}
	a := n.assess(r.Context())
	var unnamed []string
	for _, l := range a.lost {
		if l.Voter && !slices.Contains(req.Lost, l.Addr) && !slices.Contains(req.Lost, l.ID) {
			unnamed = append(unnamed, fmt.Sprintf("%s (%s)", l.ID, l.Addr))
		}
	}
	switch {
	case a.live >= a.quorum:
		refuse(http.StatusConflict, "%d of %d voters answer, a quorum: the group can elect a leader without a recovery (%s)", a.live, a.voters, a.why)
		return
	case len(unnamed) > 0:
		refuse(http.StatusConflict, "voters %s do not answer either: if they are gone for good, add them to --lost; if not, start them (the group recovers on its own once a quorum answers)", strings.Join(unnamed, ", "))
		return
	case a.wait:
		refuse(http.StatusConflict, "not recovering here: %s", a.why)
		return
	}
	sum := a.summary()
	if err := n.recoverAlone(sum, false); err != nil {
		refuse(http.StatusInternalServerError, "%v", err)
		return
	}
	writeJSON(w, RecoverResult{ID: n.id, Addr: n.addr, Summary: sum})
}

// RequestRecovery asks the member at addr, over the group port with the
// group's TLS configuration (nil: the secret-only mode) and secrets (the
// first proved first, as a member proves them), to recover its group from
// the loss of the voters lost names (addresses or IDs): the operator's
// word that they are gone for good. See docs/backends/raft.md.
// A refusal by the member is a *RecoveryRefusedError; a member that
// refuses the secret gives an error wrapping ErrSecretRefused; one that
// cannot be reached gives an error wrapping ErrNotLeader.
func RequestRecovery(ctx context.Context, tlsConfig *tls.Config, secrets []string, addr string, lost []string) (RecoverResult, error) {
	if len(secrets) == 0 {
		return RecoverResult{}, &baton.ConfigError{Problems: []string{"raft: RequestRecovery needs the group's secret"}}
	}
	cfg := tlsConfig
	if cfg == nil {
		var err error
		if cfg, err = selfSignedTLS("baton-raft-recover"); err != nil {
			return RecoverResult{}, err
		}
	}
	c := newAPIClient(newCreds(tls13(cfg), secrets...), nil)
	defer c.close()
	var out RecoverResult
	err := c.call(ctx, addr, "/v1/raft/recover", recoverRequest{Lost: lost}, &out, false)
	var ae *apiError
	if errors.As(err, &ae) {
		return out, &RecoveryRefusedError{Member: addr, Status: ae.Status, Reason: ae.Msg}
	}
	return out, err
}

// RecoveryRefusedError is a member's refusal of a recovery request.
type RecoveryRefusedError struct {
	Member string // the member's address
	Status int    // the HTTP status: 400 a bad request, 401 the secret, 409 the group's state
	Reason string // the member's words: why, and what to do instead
}

func (e *RecoveryRefusedError) Error() string {
	return fmt.Sprintf("raft: %s refused to recover: %s", e.Member, e.Reason)
}
