package raft

import (
	"context"
	"fmt"
	"strings"

	hraft "github.com/hashicorp/raft"
)

// BootstrapPlanner is an ExpectCounter that also says who bootstraps a new
// group, and with whom, from the platform's own record of its instances,
// so that at most one group forms however the members' views of the
// platform differ. The aws package's ASG implements it.
//
// BootstrapOrder returns the addresses of the members to bootstrap a new
// group with, the first being the one that bootstraps it; it returns an
// error while that cannot be decided yet (an instance it names is not
// ready). It must name the same first member to every caller for as long
// as that member's instance exists: the ASG names the min(desired
// capacity, 3) oldest-launched instances that are not terminated, oldest
// first. A member bootstraps only when it is that first member, sees no
// group among the peers it finds, and every member named answers without
// a log; the others wait and join. See docs/backends/raft.md.
type BootstrapPlanner interface {
	ExpectCounter
	BootstrapOrder(ctx context.Context) ([]string, error)
}

// bootstrapPlanned bootstraps a new group as bp's order says, or returns
// why this member waits: infos are the peers that answered, none of them
// with a log.
func (n *Node) bootstrapPlanned(bp BootstrapPlanner, infos []nodeInfo) error {
	ctx, cancel := context.WithTimeout(n.ctx, expectWait)
	defer cancel()
	order, err := bp.BootstrapOrder(ctx)
	if err != nil {
		return joinError("waiting for the instances that bootstrap the group: " + err.Error())
	}
	if len(order) == 0 {
		return joinError("the platform named no instance to bootstrap the group")
	}
	if order[0] != n.addr {
		return joinError(fmt.Sprintf("waiting for the member at %s (the oldest instance) to bootstrap the group; this member advertises %s", order[0], n.addr))
	}
	byAddr := map[string]nodeInfo{n.addr: {ID: n.id, Addr: n.addr, Witness: n.opts.Witness}}
	for _, in := range infos {
		byAddr[in.Addr] = in
	}
	var conf hraft.Configuration
	var missing []string
	voters := 0
	for _, addr := range order {
		in, ok := byAddr[addr]
		if !ok {
			missing = append(missing, addr)
			continue
		}
		s := hraft.Server{ID: hraft.ServerID(in.ID), Address: hraft.ServerAddress(in.Addr), Suffrage: hraft.Nonvoter}
		if voters < n.opts.Voters {
			s.Suffrage = hraft.Voter
			voters++
		}
		conf.Servers = append(conf.Servers, s)
	}
	if len(missing) > 0 {
		return joinError("this member bootstraps the group (the oldest instance); waiting for the members at " + strings.Join(missing, ", ") + " to answer")
	}
	if err := n.await(n.raft.BootstrapCluster(conf)); err != nil {
		return err
	}
	n.log.Info("bootstrapped a new group", "members", len(conf.Servers), "voters", voters, "rule", "oldest instance")
	return nil
}
