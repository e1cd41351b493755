package raft

import (
	"time"

	"github.com/batonhq/baton/backend"
)

// Tokens are the group's epoch<<32 + a log index, and the epoch is the
// wall-clock second at which the group's first acquire was proposed (see
// the package doc). A group that loses its whole state (every member in
// memory, all restarted) starts a new epoch from the clock of whoever
// proposes its first acquire: a clock behind the old one's gives tokens
// below the old group's. Nothing can stop that inside the new group, which
// remembers nothing; but whoever can see it says so, at Error:
//
//   - a member that learns an epoch ahead of its own wall clock (its clock
//     is behind the one that set it, which is what makes the next group
//     it starts hand out lower tokens);
//   - the member that grants an agent client a token not above one the
//     client says it held for the lease before (the client tells it with
//     each acquire);
//   - a Backend granted a token not above one it held for the lease.

// epochClockSlack is how far the group's epoch may be ahead of a member's
// clock before the member reports it: an epoch is a whole second, and the
// clocks of members kept by NTP differ by milliseconds.
const epochClockSlack = time.Second

// now is this member's wall clock.
func (n *Node) now() time.Time {
	if n.opts.wallClock != nil {
		return n.opts.wallClock()
	}
	return time.Now()
}

// wallNow is the wall clock of the member g is, or this process's for a
// Client (whose member stamps its own time on what it proposes).
func wallNow(g Group) time.Time {
	if n, ok := g.(*Node); ok {
		return n.now()
	}
	return time.Now()
}

// checkEpochClock reports at Error the group's epoch e when it is ahead of
// this member's wall clock. The fsm calls it as its copy of the log
// learns e.
func (n *Node) checkEpochClock(e uint64) {
	now := n.now()
	ahead := backend.EpochTime(e).Sub(now)
	if ahead <= epochClockSlack {
		return
	}
	n.log.Error("the group's epoch is ahead of this member's wall clock: this clock is behind the one that started the group; "+
		"should the whole group lose its state and this member start the new one, its fencing tokens would be lower than the old group's: fix this host's clock (NTP)",
		"epoch", backend.FormatEpoch(e), "clock", now.UTC().Format(time.RFC3339), "ahead", ahead.Round(time.Second))
}

// checkTokenAboveHeld reports at Error, on the raft leader that applied an
// agent client's acquire of lease, a token granted at once (res) that is
// not above held, the highest the client says it held for the lease.
func (n *Node) checkTokenAboveHeld(lease, session string, res *result, held uint64) {
	if res == nil || !res.Holder || held == 0 || res.Token > held {
		return
	}
	if res.Again && res.Token == held {
		// The client's own term whose release did not land: the client
		// releases it and campaigns anew (Backend.campaign).
		return
	}
	n.log.Error("granted a fencing token not above one the client held for the lease: the group lost its state and was started again by a member whose wall clock is behind the old group's epoch; "+
		"stores fencing with the token will refuse this holder's writes: fix the clocks (NTP), and see the raft package doc on epochs",
		"lease", lease, "session", session, "token", res.Token, "client_held", held,
		"epoch", backend.FormatEpoch(res.Token>>32), "client_epoch", backend.FormatEpoch(held>>32))
}

// heldToken returns the highest token b held for lease name (0: none).
func (b *Backend) heldToken(name string) uint64 {
	b.heldMu.Lock()
	defer b.heldMu.Unlock()
	return b.held[name]
}

// sawHeld records token, granted to b for lease name, and reports at
// Error a token not above one b held for name before.
func (b *Backend) sawHeld(name string, token uint64) {
	b.heldMu.Lock()
	prev := b.held[name]
	if b.held == nil {
		b.held = map[string]uint64{}
	}
	b.held[name] = max(prev, token)
	b.heldMu.Unlock()
	if prev == 0 || token > prev {
		return
	}
	b.log.Error("granted a fencing token not above one this process held for the lease before: the raft group lost its state and was started again by a member whose wall clock is behind the old group's epoch; "+
		"stores fencing with the token will refuse this term's writes: fix the clocks (NTP), and see the raft package doc on epochs",
		"lease", name, "token", token, "held", prev, "epoch", backend.FormatEpoch(token>>32), "held_epoch", backend.FormatEpoch(prev>>32))
}
