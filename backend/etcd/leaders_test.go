package etcd_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestLeadersOnServerWithFewTxnOps: on an etcd that takes at most 8
// operations per transaction (--max-txn-ops=8; the default is 128),
// Leaders still answers every name of a long list, in fewer names per
// transaction, and a name Leader refuses gets Leader's error.
func TestLeadersOnServerWithFewTxnOps(t *testing.T) {
	srv := testserver.StartEtcdFlags(t, "--max-txn-ops=8")
	b := newBackend(t, etcd.NewTestClient(t, srv.Endpoint()), etcd.Options{Config: backend.Config{TTL: 2 * time.Second}})
	names := make([]string, 100)
	for i := range names {
		names[i] = fmt.Sprintf("few-ops-%d", i)
	}
	held := map[int]baton.Term{}
	for _, i := range []int{0, 3, 4, 50, 99} {
		held[i] = testkit.CampaignWithin(t, b, names[i], fmt.Sprintf("holder-%d", i), 10*time.Second)
	}
	names = append(names, "not/a/name")
	for round := range 2 { // the second round starts from the learnt size
		recs, errs := b.Leaders(testkit.Context(t, 30*time.Second), names)
		for i, name := range names[:100] {
			term, isHeld := held[i]
			switch {
			case !isHeld && !errors.Is(errs[i], baton.ErrNoLeader):
				t.Errorf("round %d: %s, held by nobody: %+v, %v; want ErrNoLeader", round, name, recs[i], errs[i])
			case isHeld && (errs[i] != nil || recs[i].Holder != fmt.Sprintf("holder-%d", i) || recs[i].Token != term.Token()):
				t.Errorf("round %d: %s, held by holder-%d with token %d: %+v, %v", round, name, i, term.Token(), recs[i], errs[i])
			}
		}
		if errs[100] == nil || errors.Is(errs[100], baton.ErrNoLeader) {
			t.Errorf("round %d: Leaders of %q: %v, want Leader's refusal of the name", round, names[100], errs[100])
		}
	}
}
