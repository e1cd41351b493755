package raftagent

import (
	"context"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/cmd/baton/internal/statusapi"
)

// NodeSource shows a raft member to package statusapi: its lease table,
// read through the raft leader (linearizable), the lease events it
// applies, and its view of the group.
type NodeSource struct{ N Source }

var (
	_ statusapi.Source      = NodeSource{}
	_ statusapi.GroupSource = NodeSource{}
)

// ID returns the member's node ID.
func (s NodeSource) ID() string { return s.N.ID() }

// Determined returns nil when the member has a raft leader it hears from.
func (s NodeSource) Determined() error { return s.N.Determined() }

// Leases returns the group's lease table.
func (s NodeSource) Leases(ctx context.Context) ([]statusapi.LeaseInfo, error) {
	infos, err := s.N.Leases(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]statusapi.LeaseInfo, len(infos))
	for i, in := range infos {
		out[i] = leaseInfo(in)
	}
	return out, nil
}

// Lease returns one lease of the group's table.
func (s NodeSource) Lease(ctx context.Context, name string) (statusapi.LeaseInfo, error) {
	in, err := s.N.Lease(ctx, name)
	if err != nil {
		return statusapi.LeaseInfo{}, err
	}
	return leaseInfo(in), nil
}

// WatchLeases follows the lease events the member applies.
func (s NodeSource) WatchLeases(fn func(statusapi.Event)) (stop func()) {
	return s.N.WatchLeases(func(ev raft.LeaseEvent) {
		fn(statusapi.Event{Lease: ev.Lease, Kind: statusapi.EventKind(ev.Kind), Holder: ev.Holder, Session: ev.Session,
			Member: ev.Member, Token: ev.Token, Reason: ev.Reason})
	})
}

// Group returns the member's view of its group.
func (s NodeSource) Group() (statusapi.Group, bool) {
	st := s.N.Status()
	return statusapi.Group{ID: st.ID, State: st.State, Leader: st.Leader, Voters: st.Voters, Members: st.Members}, true
}

func leaseInfo(in raft.LeaseInfo) statusapi.LeaseInfo {
	return statusapi.LeaseInfo{Name: in.Name, Holder: in.Holder, Token: in.Token, Since: in.Since, SafeUntil: in.SafeUntil,
		Member: in.Member, Waiters: in.Waiters, ResignRequested: in.ResignRequested}
}
