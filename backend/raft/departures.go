package raft

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	hraft "github.com/hashicorp/raft"
)

// Departures tells the raft leader which members' machines the platform
// they run on has taken away, so that it removes them from the
// configuration sooner than autopilot's dead-server timeout. The aws
// package's ASG implements it for an EC2 Auto Scaling group.
//
// Its word alone never removes a member: the leader removes a reported
// member only once that member has stopped answering (see
// NodeOptions.Departures).
type Departures interface {
	// Departed reports, of the raft members' addresses given (host:port),
	// those whose instance the group reports Terminating*/Terminated or no
	// longer has, each with a reason for the logs. An address it cannot
	// place is left out: not reported means not known to have departed.
	Departed(ctx context.Context, addrs []string) (map[string]string, error)
}

// DeparturesSince is a Departures that can answer from a view of the
// platform fetched after a given time. When a member has gone quiet, the
// raft leader asks it with the time that member last answered, so that a
// cached view from before the member's instance went away does not keep
// the member in the configuration until autopilot's dead-server timeout.
// The aws package's ASG implements it.
type DeparturesSince interface {
	Departures
	// DepartedSince is Departed, from a view fetched after since where
	// the implementation's own limit on calls to the platform allows; it
	// may answer from an older view until then.
	DepartedSince(ctx context.Context, addrs []string, since time.Time) (map[string]string, error)
}

// ExpectCounter decides how many members a new group waits for before it
// bootstraps, from the platform the members run on (the aws package's ASG:
// min(desired capacity, 3) once that many instances are InService). See
// NodeOptions.ExpectCounter.
type ExpectCounter interface {
	// BootstrapExpect blocks until the platform has the number of members
	// it returns ready, or ctx ends.
	BootstrapExpect(ctx context.Context) (int, error)
}

// defaultDeparturesEvery is the default NodeOptions.DeparturesEvery.
const defaultDeparturesEvery = 5 * time.Second

// departuresCallTimeout bounds one Departed call: an implementation that
// backs off on throttling may take a while, and the watch waits for it.
const departuresCallTimeout = 30 * time.Second

// departureWatch is what the raft leader knows, in one term, of the
// members that Departures reported. It runs on one goroutine
// (followDepartures).
type departureWatch struct {
	n *Node
	// start is when the term's watch began: a member counts as silent
	// only after a full window of this term without an answer, whatever
	// an earlier term of this member saw.
	start time.Time
	// window is how long a member must go without answering the leader to
	// count as not answering: autopilot's LastContactThreshold.
	window time.Duration

	reported map[string]string            // address -> reason, from the last answer
	answered map[hraft.ServerID]time.Time // last answer to a probe of this watch
	failing  bool                         // the last Departed call failed
}

// onceLog remembers, per member, the reason last logged, so that a state
// is logged once and not at every tick, nor again when this member is
// elected raft leader anew. Safe for concurrent use: the watches of two
// terms may overlap for a moment.
type onceLog struct {
	mu   sync.Mutex
	last map[hraft.ServerID]string
}

// first reports whether reason is new for id, and remembers it.
func (o *onceLog) first(id hraft.ServerID, reason string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.last == nil {
		o.last = map[hraft.ServerID]string{}
	}
	if o.last[id] == reason {
		return false
	}
	o.last[id] = reason
	return true
}

// keep forgets every member but those keep accepts.
func (o *onceLog) keep(keep func(hraft.ServerID) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for id := range o.last {
		if !keep(id) {
			delete(o.last, id)
		}
	}
}

// followDepartures runs while this member is the ready raft leader (ctx is
// the term's): it asks Departures about the other members every
// DeparturesEvery, and at once when the configuration changes or a member
// goes quiet, and removes a reported member that no longer answers.
func (n *Node) followDepartures(ctx context.Context) {
	defer n.wg.Done()
	w := &departureWatch{
		n: n, start: time.Now(), window: max(2*n.opts.HeartbeatTimeout, time.Second),
		reported: map[string]string{}, answered: map[hraft.ServerID]time.Time{},
	}
	tick := time.NewTicker(n.opts.HeartbeatTimeout)
	defer tick.Stop()
	var asked time.Time
	var askedOn string
	for {
		if servers, ok := n.configServers(); ok {
			// While a member is quiet and not reported, ask at every tick:
			// a DeparturesSince brings its view up to date as its own
			// limit allows, and a plain Departures answers from its cache.
			if on := w.situation(servers); on != askedOn || time.Since(asked) >= n.opts.DeparturesEvery || !w.quietSince(servers).IsZero() {
				w.ask(ctx, servers)
				asked, askedOn = time.Now(), on
			}
			w.act(ctx, servers)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// configServers returns the current configuration's servers.
func (n *Node) configServers() ([]hraft.Server, bool) {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil, false
	}
	return f.Configuration().Servers, true
}

// situation describes what would make the last answer out of date: the
// configuration, and which members have gone quiet.
func (w *departureWatch) situation(servers []hraft.Server) string {
	now := time.Now()
	var parts []string
	for _, s := range servers {
		p := string(s.ID) + "@" + string(s.Address) + "/" + s.Suffrage.String()
		if string(s.ID) != w.n.id && w.quiet(s.ID, now) {
			p += "/quiet"
		}
		parts = append(parts, p)
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// quiet reports whether member id has not answered the leader, to
// autopilot's probes or this watch's, for a full window of this term.
func (w *departureWatch) quiet(id hraft.ServerID, now time.Time) bool {
	return now.Sub(w.lastHeard(id)) > w.window
}

// lastHeard is when member id last answered the leader, to autopilot's
// probes or this watch's, or the watch's start if not since.
func (w *departureWatch) lastHeard(id hraft.ServerID) time.Time {
	last := w.start
	w.n.mu.Lock()
	if seen := w.n.lastSeen[id]; seen.After(last) {
		last = seen
	}
	w.n.mu.Unlock()
	if a := w.answered[id]; a.After(last) {
		last = a
	}
	return last
}

// quietSince returns the latest time at which a quiet member that the
// last answer did not report answered: the view of the platform must be
// newer than that to tell whether its instance went away. Zero when no
// member is quiet and unreported.
func (w *departureWatch) quietSince(servers []hraft.Server) time.Time {
	now := time.Now()
	var since time.Time
	for _, s := range servers {
		if string(s.ID) == w.n.id || !w.quiet(s.ID, now) {
			continue
		}
		if _, ok := w.reported[string(s.Address)]; ok {
			continue
		}
		if last := w.lastHeard(s.ID); last.After(since) {
			since = last
		}
	}
	return since
}

// ask asks Departures about every other member. A failed call keeps the
// previous answer: an instance that was leaving does not come back.
func (w *departureWatch) ask(ctx context.Context, servers []hraft.Server) {
	var addrs []string
	for _, s := range servers {
		if string(s.ID) != w.n.id {
			addrs = append(addrs, string(s.Address))
		}
	}
	if len(addrs) == 0 {
		w.reported = map[string]string{}
		return
	}
	cctx, cancel := context.WithTimeout(ctx, departuresCallTimeout)
	var got map[string]string
	var err error
	if ds, ok := w.n.opts.Departures.(DeparturesSince); ok {
		got, err = ds.DepartedSince(cctx, addrs, w.quietSince(servers))
	} else {
		got, err = w.n.opts.Departures.Departed(cctx, addrs)
	}
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if !w.failing {
			w.n.log.Warn("could not ask which members' instances departed; autopilot's dead-server cleanup still applies", "err", err)
		}
		w.failing = true
		return
	}
	if w.failing {
		w.n.log.Info("asking which members' instances departed works again")
	}
	w.failing = false
	w.reported = got
	if w.reported == nil {
		w.reported = map[string]string{}
	}
}

// act removes at most one reported member that no longer answers, and
// logs, once per member and reason, each reported member that still does.
func (w *departureWatch) act(ctx context.Context, servers []hraft.Server) {
	present := map[hraft.ServerID]bool{}
	reported := map[hraft.ServerID]bool{}
	defer func() {
		w.n.departWarned.keep(func(id hraft.ServerID) bool { return reported[id] })
		w.n.departRefused.keep(func(id hraft.ServerID) bool { return reported[id] })
	}()
	for _, s := range servers {
		present[s.ID] = true
		reason, ok := w.reported[string(s.Address)]
		if !ok || string(s.ID) == w.n.id {
			continue
		}
		reported[s.ID] = true
		if w.n.probe1(ctx, s) {
			w.answered[s.ID] = time.Now()
		}
		if ctx.Err() != nil {
			return
		}
		if !w.quiet(s.ID, time.Now()) {
			if w.n.departWarned.first(s.ID, reason) {
				w.n.log.Warn("the platform reports this member's instance departed, but the member still answers: keeping it",
					"id", s.ID, "addr", s.Address, "reason", reason)
			}
			continue
		}
		if w.remove(ctx, s, reason) {
			return // the configuration changed: look again at the next tick
		}
	}
	for id := range w.answered {
		if !present[id] {
			delete(w.answered, id)
		}
	}
}

// remove takes the departed, silent member s out of the configuration,
// unless that would cost the quorum. It reports whether the configuration
// changed.
//
// Removing a voter that does not answer never lowers the number of
// answering voters, and it lowers the quorum (or keeps it): a group of
// three whose instances are replaced one by one keeps a majority of live
// members only if each departed voter goes before the next one leaves.
// Two rules keep a removal from costing the quorum. A healthy non-voter
// (the replacement) is promoted first, as for a graceful leave. And the
// voters that answer this leader now must be a majority of the voters that
// remain; otherwise the group has lost its quorum already, and a removal
// it cannot commit would only stall this leader.
func (w *departureWatch) remove(ctx context.Context, s hraft.Server, reason string) bool {
	n := w.n
	if s.Suffrage == hraft.Voter {
		n.promoteReplacement(string(s.ID))
		servers, ok := n.configServers()
		if !ok {
			return false
		}
		voters, live := 0, 0
		for _, v := range servers {
			if v.Suffrage != hraft.Voter {
				continue
			}
			voters++
			switch {
			case string(v.ID) == n.id:
				live++
			case v.ID == s.ID:
			case !w.quiet(v.ID, time.Now()) || n.probe1(ctx, v):
				// It answered autopilot's probes or this watch's within
				// the window, or answers now.
				live++
			}
		}
		if ctx.Err() != nil {
			return false
		}
		if remaining := voters - 1; live < remaining/2+1 {
			if n.departRefused.first(s.ID, reason) {
				n.log.Warn("not removing a departed voter: the voters that answer would not be a majority of those left",
					"id", s.ID, "addr", s.Address, "reason", reason, "voters", voters, "answering", live)
			}
			return false
		}
	}
	n.log.Info("removing a member whose instance departed and that no longer answers",
		"id", s.ID, "addr", s.Address, "reason", reason, "voter", s.Suffrage == hraft.Voter)
	if err := n.removeServer(s.ID); err != nil {
		n.log.Warn("could not remove a departed member", "id", s.ID, "err", err)
		return false
	}
	n.mu.Lock()
	delete(n.lastSeen, s.ID)
	n.mu.Unlock()
	delete(w.answered, s.ID)
	return true
}

// probe1 reports whether member s answers an info request as itself
// within a heartbeat timeout (at least a second: a loaded member that
// answers late still answers).
func (n *Node) probe1(ctx context.Context, s hraft.Server) bool {
	cctx, cancel := context.WithTimeout(ctx, max(n.opts.HeartbeatTimeout, time.Second))
	defer cancel()
	var in nodeInfo
	err := n.client.call(cctx, string(s.Address), "/v1/raft/info", nil, &in, false)
	return err == nil && in.ID == string(s.ID)
}
