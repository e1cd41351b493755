package raftagent

import (
	"github.com/batonhq/baton/cmd/baton/internal/statusapi"
)

// NodeSource shows a raft member to package statusapi: its lease table,
// read through the raft leader (linearizable), and the lease events it
// applies, as the member reports them (Source's own methods), and its
// view of the group.
type NodeSource struct{ Source }

var (
	_ statusapi.Source      = NodeSource{}
	_ statusapi.GroupSource = NodeSource{}
)

// Group returns the member's view of its group.
func (s NodeSource) Group() (statusapi.Group, bool) {
	st := s.Status()
	return statusapi.Group{ID: st.ID, State: st.State, Leader: st.Leader, Voters: st.Voters, Members: st.Members}, true
}
