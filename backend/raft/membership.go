package raft

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	hraft "github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
)

// membership gets this member into a group: it joins a live group that
// discovery finds, or, with BootstrapExpect set, bootstraps a new one once
// enough members are seen and none of them is in a group. Then it keeps
// checking, so that a member removed while it was away (it left, or
// autopilot took it for dead) joins again. It gives up (see Failed) when
// the members of a live group refuse this member's secret.
func (n *Node) membership() {
	defer n.wg.Done()
	backoff := 100 * time.Millisecond
	refusedRounds := 0
	for n.ctx.Err() == nil {
		if n.isReady() && !n.inConfiguration() {
			// This member leads but the configuration lists it elsewhere
			// (restarted with its log on a new port): fix its own entry.
			if err := n.addMember(joinRequest{ID: n.id, Addr: n.addr, Witness: n.opts.Witness}); err != nil {
				n.log.Warn("could not update this member's address", "err", err)
			}
		}
		if n.inGroup() {
			n.joinOne.Do(func() { close(n.joined) })
			n.logConfiguration()
			n.avoidLeadingAndHolding()
			backoff = 100 * time.Millisecond
			if !n.sleep(max(n.opts.HeartbeatTimeout, time.Second)) {
				return
			}
			continue
		}
		err := n.tryJoin()
		if errors.Is(err, ErrSecretRefused) || errors.Is(err, ErrCertificateRefused) {
			// A live group that refuses the secret now refuses it until
			// someone gives this member the group's; so for a certificate
			// that a majority of the peers refuses. A few rounds in a row,
			// so that one odd answer decides nothing.
			if refusedRounds++; refusedRounds >= refusedRoundsToFail {
				n.fail(err)
				return
			}
		} else {
			refusedRounds = 0
		}
		if err != nil {
			n.log.Debug("not in a group yet", "err", err)
		}
		n.setJoinErr(err)
		if !n.sleep(backoff) {
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// avoidLeadingAndHolding hands raft leadership to a voter whose member
// holds no lease when this member both leads the group and holds a lease:
// a crash of such a member would cost half a heartbeat timeout (or the
// election, when it takes longer) on top of the TTL before its lease moves
// on. Only to a member that holds nothing, so that leaders
// never bounce between holders.
func (n *Node) avoidLeadingAndHolding() {
	if !n.isReady() {
		return
	}
	holding := n.fsm.holdingMembers()
	if !holding[n.id] {
		return
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	_, lastTerm := n.lastLog()
	for _, s := range f.Configuration().Servers {
		if s.Suffrage != hraft.Voter || string(s.ID) == n.id || holding[string(s.ID)] {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, time.Second)
		var in nodeInfo
		err := n.client.call(ctx, string(s.Address), "/v1/raft/info", nil, &in, false)
		cancel()
		if err != nil || in.ID != string(s.ID) || in.LastTerm != lastTerm || in.LastIndex+50 < n.raft.LastIndex() {
			continue
		}
		n.log.Info("handing raft leadership to a member that holds no lease", "to", s.ID)
		if err := n.await(n.raft.LeadershipTransferToServer(s.ID, s.Address)); err != nil {
			n.log.Debug("leadership transfer failed", "to", s.ID, "err", err)
		}
		return
	}
}

// logConfiguration logs the group's configuration when it changed since
// the last call.
func (n *Node) logConfiguration() {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	var voters, others []string
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == hraft.Voter {
			voters = append(voters, string(s.Address))
		} else {
			others = append(others, string(s.Address))
		}
	}
	slices.Sort(voters)
	slices.Sort(others)
	line := strings.Join(voters, ",") + " " + strings.Join(others, ",")
	if line == n.lastConf {
		return
	}
	n.lastConf = line
	n.log.Info("group configuration", "voters", strings.Join(voters, ","), "non_voters", strings.Join(others, ","))
}

func (n *Node) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// errLeaderless is tryJoin's answer when peers hold a log but none knows a
// raft leader: the group may have lost its quorum.
var errLeaderless = joinError("a peer has a log but no leader yet: waiting to join its group")

// setJoinErr records why the last join attempt did not get the member in
// (nil: it did), for StartMember's reminders.
func (n *Node) setJoinErr(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.joinErr = err
}

// lastJoinErr returns why the last join attempt did not get the member in.
func (n *Node) lastJoinErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.joinErr
}

// inGroup reports whether this member is in its group's configuration and
// knows a leader.
func (n *Node) inGroup() bool {
	addr, _ := n.raft.LeaderWithID()
	return addr != "" && n.inConfiguration()
}

type joinError string

func (e joinError) Error() string { return string(e) }

// refusedRoundsToFail is how many join attempts in a row must find only
// refusals of the secret by members of a live group before the member
// gives up.
const refusedRoundsToFail = 3

// Failed is closed when the member gives up on joining for a reason that
// retrying cannot fix; Err says why: a majority of the peers found, as
// members of a live group, refused its secret (errors.Is(Err(),
// ErrSecretRefused)), or a majority of the peers
// found (two at least) refused its certificate or presented ones its CA
// did not sign, and none let it in (errors.Is(Err(),
// ErrCertificateRefused)): in CA mode, TLS files of another CA; in the
// secret-only mode, a group in CA mode.
// The member keeps running until Close, but never joins.
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Err returns why the member gave up on joining once Failed is closed,
// and nil before.
func (n *Node) Err() error {
	select {
	case <-n.failed:
		return n.failErr
	default:
		return nil
	}
}

func (n *Node) fail(err error) {
	n.failErr = err
	if errors.Is(err, ErrCertificateRefused) {
		n.log.Error("giving up on joining: the group refuses this member's certificate; give it the group's CA certificate and a certificate that CA signed", "err", err)
		close(n.failed)
		return
	}
	n.log.Error("giving up on joining: the group refuses this member's secret; give it the group's (BATON_SECRET or --secret-file)", "err", err)
	close(n.failed)
}

// hasJoined reports whether the member has been in a group with a leader.
func (n *Node) hasJoined() bool {
	select {
	case <-n.joined:
		return true
	default:
		return false
	}
}

// tryJoin makes one attempt to join or bootstrap. It returns an error that
// wraps ErrSecretRefused when no peer let this member in and members of a
// live group refused its secret.
func (n *Node) tryJoin() error {
	peers, err := n.discover()
	if err != nil {
		return err
	}
	infos, refused := n.probe(peers)
	if len(infos) == 0 && len(refused) == 0 {
		// In CA mode (the members verify each other against a CA's
		// certificate pool) a certificate of another CA fails the TLS handshake
		// before any secret is proved; so does the self-signed certificate
		// of a secret-only member beside a CA-mode group (secret-only
		// members verify no certificate, so among themselves none fails).
		// A majority of the peers found refusing it (a peer merely
		// starting refuses nothing) means no group can take this member
		// in; two at least, so that one misconfigured peer never ends
		// another member.
		cr := certRefusedError{secretOnly: n.opts.TLS == nil}
		for _, f := range n.lastCertFaults {
			if f.fault == certOurs {
				cr.ours = append(cr.ours, f.addr)
			} else {
				cr.theirs = append(cr.theirs, f.addr)
			}
		}
		cr.found = len(peers)
		if k := len(cr.ours) + len(cr.theirs); k >= 2 && k > len(peers)/2 {
			return &cr
		}
	}
	if len(infos) == 0 {
		var live []string
		for _, r := range refused {
			if r.inGroup {
				live = append(live, r.addr)
			}
		}
		// A majority of the peers found: a refusal proves nothing about
		// the refuser (it could not check the proof, so it need not hold
		// any secret; in the secret-only mode it needs no certificate
		// either), and one impostor at one peer's address must not end
		// this member.
		if len(live) > 0 && len(live) > len(peers)/2 {
			return fmt.Errorf("%w: members of a live group at %s (%d of the %d peers found) refused it", ErrSecretRefused, strings.Join(live, ", "), len(live), len(peers))
		}
	}
	// A live group first: join it through any member (followers forward).
	for _, in := range infos {
		if in.Leader == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
		err := n.client.call(ctx, in.Addr, "/v1/raft/join", joinRequest{ID: n.id, Addr: n.addr, Witness: n.opts.Witness}, nil, false)
		cancel()
		if err == nil {
			n.log.Info("joined the group", "via", in.Addr, "leader", in.LeaderID)
			return nil
		}
		n.log.Debug("join failed", "via", in.Addr, "err", err)
	}
	if n.opts.BootstrapExpect == 0 && n.opts.ExpectCounter == nil {
		return joinError("no live group found, and BootstrapExpect is 0 (join only)")
	}
	if n.raft.LastIndex() > 0 {
		return joinError("this member has a log but no leader: waiting for its group")
	}
	// Bootstrap only among members that have never been in a group; one
	// that has (an election in progress, say) means a group exists.
	cands := []nodeInfo{{ID: n.id, Addr: n.addr, Witness: n.opts.Witness}}
	for _, in := range infos {
		if in.HasState {
			return errLeaderless
		}
		cands = append(cands, in)
	}
	if bp, ok := n.opts.ExpectCounter.(BootstrapPlanner); ok {
		return n.bootstrapPlanned(bp, infos)
	}
	expect, err := n.bootstrapExpect()
	if err != nil {
		return err
	}
	if len(cands) < expect {
		return joinError(fmt.Sprintf("waiting for bootstrap-expect members (%d of %d seen)", len(cands), expect))
	}
	slices.SortFunc(cands, func(a, b nodeInfo) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	cands = cands[:expect]
	if cands[0].ID != n.id {
		return joinError("waiting for " + cands[0].ID + " (lowest ID) to bootstrap")
	}
	var conf hraft.Configuration
	voters := 0
	vote := bootstrapVoters(cands, n.opts.Voters)
	for i, c := range cands {
		s := hraft.Server{ID: hraft.ServerID(c.ID), Address: hraft.ServerAddress(c.Addr), Suffrage: hraft.Nonvoter}
		if vote[i] {
			s.Suffrage = hraft.Voter
			voters++
		}
		conf.Servers = append(conf.Servers, s)
	}
	if err := n.await(n.raft.BootstrapCluster(conf)); err != nil {
		return err
	}
	n.log.Info("bootstrapped a new group", "members", len(conf.Servers), "voters", voters)
	return nil
}

// expectWait bounds one wait for ExpectCounter, so that the member keeps
// looking for a live group to join meanwhile.
const expectWait = 10 * time.Second

// bootstrapExpect returns BootstrapExpect, or the count ExpectCounter
// returns (asked until it answers, then kept).
func (n *Node) bootstrapExpect() (int, error) {
	if n.opts.ExpectCounter == nil {
		return n.opts.BootstrapExpect, nil
	}
	if n.expect > 0 {
		return n.expect, nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, expectWait)
	defer cancel()
	count, err := n.opts.ExpectCounter.BootstrapExpect(ctx)
	switch {
	case err != nil:
		return 0, joinError("waiting for the count of members to bootstrap with (bootstrap-expect auto): " + err.Error())
	case count < 1:
		return 0, joinError(fmt.Sprintf("bootstrap-expect auto counted %d members: waiting for at least 1", count))
	}
	n.log.Info("bootstrap-expect decided", "expect", count)
	n.expect = count
	return count, nil
}

// discover returns the peers' addresses, without our own.
func (n *Node) discover() ([]string, error) {
	if n.opts.Discovery == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, 30*time.Second)
	defer cancel()
	all, err := n.opts.Discovery.Peers(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(slices.Clone(all), func(a string) bool { return a == n.addr }), nil
}

// probe asks each peer about itself, in parallel; peers that don't answer
// (or answer with our own ID: our address under another name) are left out.
// Those that refused this member's secret are returned apart, and logged.
func (n *Node) probe(peers []string) ([]nodeInfo, []*refusedError) {
	var (
		mu      sync.Mutex
		out     []nodeInfo
		refused []*refusedError
		faults  []peerCertFault
		wg      sync.WaitGroup
	)
	defer func() { n.lastCertFaults = faults }()
	for _, p := range peers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
			defer cancel()
			var in nodeInfo
			err := n.client.call(ctx, p, "/v1/raft/info", nil, &in, false)
			if f := certProblem(err); f != certFine {
				if f == certOurs {
					n.refusals.warn("a peer refused this member's certificate: it was not signed by the group's CA", p, err)
				} else {
					n.refusals.warn("a peer presented a certificate that this member's CA did not sign", p, err)
				}
				mu.Lock()
				faults = append(faults, peerCertFault{p, f})
				mu.Unlock()
				return
			}
			if re := (*refusedError)(nil); errors.As(err, &re) {
				n.refusals.warn("a peer refused this member's secret", p, re)
				mu.Lock()
				refused = append(refused, re)
				mu.Unlock()
				return
			}
			if err != nil || in.ID == n.id {
				return
			}
			in.Addr = p
			mu.Lock()
			out = append(out, in)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out, refused
}

// peerCertFault is a peer whose TLS handshake with this member failed on
// a certificate, and which side's.
type peerCertFault struct {
	addr  string
	fault certFault
}

// pilotDelegate connects autopilot to the Node.
type pilotDelegate struct{ n *Node }

func (d *pilotDelegate) AutopilotConfig() *autopilot.Config {
	return &autopilot.Config{
		CleanupDeadServers:      true,
		LastContactThreshold:    max(2*d.n.opts.HeartbeatTimeout, time.Second),
		MaxTrailingLogs:         500,
		MinQuorum:               uint(d.n.opts.Voters),
		ServerStabilizationTime: d.n.opts.StabilizationTime,
	}
}

func (d *pilotDelegate) NotifyState(*autopilot.State) {}

// FetchServerStats asks every member for its log position, and records who
// answered: KnownServers calls a member failed after DeadServerAfter of
// silence.
func (d *pilotDelegate) FetchServerStats(ctx context.Context, servers map[hraft.ServerID]*autopilot.Server) map[hraft.ServerID]*autopilot.ServerStats {
	n := d.n
	var (
		mu  sync.Mutex
		out = map[hraft.ServerID]*autopilot.ServerStats{}
		wg  sync.WaitGroup
	)
	for id, srv := range servers {
		wg.Go(func() {
			var in nodeInfo
			if string(id) == n.id {
				in = n.info()
			} else {
				cctx, cancel := context.WithTimeout(ctx, n.opts.HeartbeatTimeout)
				err := n.client.call(cctx, string(srv.Address), "/v1/raft/info", nil, &in, false)
				cancel()
				if err != nil || in.ID != string(id) {
					return
				}
			}
			mu.Lock()
			out[id] = &autopilot.ServerStats{LastContact: in.LastContact, LastTerm: in.LastTerm, LastIndex: in.LastIndex}
			mu.Unlock()
			n.mu.Lock()
			n.lastSeen[id] = time.Now()
			n.mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// KnownServers lists the configuration's members, alive unless the leader
// has not heard from one for DeadServerAfter.
func (d *pilotDelegate) KnownServers() map[hraft.ServerID]*autopilot.Server {
	n := d.n
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	_, leader := n.raft.LeaderWithID()
	now := time.Now()
	out := map[hraft.ServerID]*autopilot.Server{}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range f.Configuration().Servers {
		seen, ok := n.lastSeen[s.ID]
		if !ok {
			// First sight on this leader: give it the full grace period.
			seen = now
			n.lastSeen[s.ID] = now
		}
		status := autopilot.NodeAlive
		if string(s.ID) != n.id && now.Sub(seen) > n.opts.DeadServerAfter {
			status = autopilot.NodeFailed
		}
		out[s.ID] = &autopilot.Server{
			ID: s.ID, Name: string(s.ID), Address: s.Address, NodeStatus: status,
			RaftVersion: hraft.ProtocolVersionMax, IsLeader: s.ID == leader, NodeType: autopilot.NodeVoter,
		}
	}
	return out
}

func (d *pilotDelegate) RemoveFailedServer(s *autopilot.Server) {
	n := d.n
	n.log.Info("removing a dead member", "id", s.ID, "addr", s.Address)
	if err := n.removeServer(s.ID); err != nil {
		n.log.Warn("could not remove a dead member", "id", s.ID, "err", err)
		return
	}
	n.mu.Lock()
	delete(n.lastSeen, s.ID)
	n.mu.Unlock()
}

// cappedPromoter decides the voters: at most voters of them, on as many
// hosts as the group has. A host is the IP (or name) of a member's
// advertised address, so that a `baton agent` beside a `baton run` on one
// instance (two members, two ports, one address) is never a second voter
// for that instance while another host could vote instead: the loss of
// one instance must cost one vote. Two voters share a host only while the
// group has fewer hosts than voters (three members on one machine, as in a
// demo or a test): a group of hosts A, A and B then keeps a majority when
// B fails, which two voters A and B would not.
//
// Each round it promotes stable, healthy non-voters: first those on a host
// with no voter at all, then on a host with no healthy voter (each adds a
// host), lowest ID first, while the healthy voters are fewer than the cap
// or their hosts are; then, while the voters are fewer than the cap, on a
// host that already votes. A promotion on a new host while the voters are
// at the cap is the first half of a swap: in a later round (autopilot
// never promotes and demotes in one), once the healthy voters' hosts reach
// the cap, every second healthy voter of one host is demoted, keeping the
// raft leader or else the lowest ID. It demotes nothing else: dead voters
// are autopilot's and Departures' to remove.
type cappedPromoter struct{ voters int }

func (p *cappedPromoter) GetServerExt(*autopilot.Config, *autopilot.ServerState) any { return nil }
func (p *cappedPromoter) GetStateExt(*autopilot.Config, *autopilot.State) any        { return nil }

func (p *cappedPromoter) GetNodeTypes(_ *autopilot.Config, s *autopilot.State) map[hraft.ServerID]autopilot.NodeType {
	out := map[hraft.ServerID]autopilot.NodeType{}
	for id := range s.Servers {
		out[id] = autopilot.NodeVoter
	}
	return out
}

func (p *cappedPromoter) FilterFailedServerRemovals(_ *autopilot.Config, _ *autopilot.State, f *autopilot.FailedServers) *autopilot.FailedServers {
	return f
}

func (p *cappedPromoter) IsPotentialVoter(t autopilot.NodeType) bool { return t == autopilot.NodeVoter }

func (p *cappedPromoter) CalculatePromotionsAndDemotions(c *autopilot.Config, s *autopilot.State) autopilot.RaftChanges {
	now := time.Now()
	stable := s.ServerStabilizationTime(c)
	healthyOn := map[string][]hraft.ServerID{} // host: its healthy voters
	votesOn := map[string]bool{}               // hosts with any voter
	hostOf := map[hraft.ServerID]string{}
	count := 0 // healthy voters
	var ready []hraft.ServerID
	for id, srv := range s.Servers {
		h := memberHost(string(srv.Server.Address))
		hostOf[id] = h
		switch {
		case srv.HasVotingRights():
			votesOn[h] = true
			if srv.Health.Healthy {
				healthyOn[h] = append(healthyOn[h], id)
				count++
			}
		case srv.State == autopilot.RaftNonVoter && srv.Health.IsStable(now, stable):
			ready = append(ready, id)
		}
	}
	slices.Sort(ready)
	hosts := len(healthyOn)
	var ch autopilot.RaftChanges
	promoted := map[hraft.ServerID]bool{}
	promote := func(id hraft.ServerID) {
		ch.Promotions = append(ch.Promotions, id)
		promoted[id] = true
		count++
	}
	// New hosts: those without a voter first, then those whose voters are
	// all unhealthy.
	for _, noVoter := range []bool{true, false} {
		for _, id := range ready {
			h := hostOf[id]
			if promoted[id] || len(healthyOn[h]) > 0 || (noVoter && votesOn[h]) {
				continue
			}
			if count >= p.voters && hosts >= p.voters {
				break
			}
			promote(id)
			healthyOn[h] = append(healthyOn[h], id)
			hosts++
		}
	}
	// A second voter on a host, only to reach the cap.
	for _, id := range ready {
		if count >= p.voters {
			break
		}
		if !promoted[id] {
			promote(id)
		}
	}
	if len(ch.Promotions) > 0 || hosts < p.voters {
		return ch
	}
	for _, ids := range healthyOn {
		if len(ids) < 2 {
			continue
		}
		slices.Sort(ids)
		keep := ids[0]
		if slices.Contains(ids, s.Leader) {
			keep = s.Leader
		}
		for _, id := range ids {
			if id != keep {
				ch.Demotions = append(ch.Demotions, id)
			}
		}
	}
	slices.Sort(ch.Demotions)
	return ch
}

// memberHost returns the host of a member's advertised address (HOST:PORT):
// members with one host are taken to run on one machine.
func memberHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// bootstrapVoters returns the suffrage of each of cands (sorted by ID) in a
// new group of at most voters voters: one per host first, lowest ID first,
// then more on hosts that have one, while there are fewer than voters (see
// cappedPromoter).
func bootstrapVoters(cands []nodeInfo, voters int) []bool {
	vote := make([]bool, len(cands))
	n := 0
	seen := map[string]bool{}
	for i, c := range cands {
		if h := memberHost(c.Addr); n < voters && !seen[h] {
			vote[i], seen[h] = true, true
			n++
		}
	}
	for i := range cands {
		if n < voters && !vote[i] {
			vote[i] = true
			n++
		}
	}
	return vote
}
