package batontest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/testkit"
)

// leadersMatchLeader checks a backend that implements baton.LeadersReader:
// for a list of leases longer than any store's batch, some held by
// candidates of two processes and some by nobody, Leaders answers what
// Leader answers for each, in the order asked; an empty list gets empty
// answers; and on a Backend whose Leader says ErrClosed after Close, so
// does Leaders, for every name.
func (s *suite) leadersMatchLeader(t *testing.T) {
	p, q := s.target.New(t, s.cfg()), s.target.New(t, s.cfg())
	lr, ok := p.Backend.(baton.LeadersReader)
	if !ok {
		t.Skipf("%T does not implement baton.LeadersReader", p.Backend)
	}
	base := leaseName(t)
	names := make([]string, 300)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", base, i)
	}
	held := map[int]baton.Term{}
	for k, i := range []int{0, 63, 64, 65, 128, 150, 299} {
		b := p.Backend
		if k%2 == 1 {
			b = q.Backend
		}
		held[i] = testkit.CampaignWithin(t, b, names[i], fmt.Sprintf("holder-%d", i), 10*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(stage string) {
		t.Helper()
		recs, errs := lr.Leaders(ctx, names)
		if len(recs) != len(names) || len(errs) != len(names) {
			t.Fatalf("%s: Leaders of %d names returned %d records and %d errors", stage, len(names), len(recs), len(errs))
		}
		for i, name := range names {
			term, isHeld := held[i]
			switch {
			case !isHeld && !errors.Is(errs[i], baton.ErrNoLeader):
				t.Errorf("%s: Leaders said %+v, %v for %s, which nobody holds; want ErrNoLeader", stage, recs[i], errs[i], name)
			case !isHeld:
			case errs[i] != nil:
				t.Errorf("%s: Leaders failed for %s, held by holder-%d: %v", stage, name, i, errs[i])
			default:
				want, err := p.Backend.Leader(ctx, name)
				if err != nil {
					t.Fatalf("%s: Leader(%s): %v", stage, name, err)
				}
				got := recs[i]
				if got.Lease != name || got.Holder != want.Holder || got.Token != want.Token || got.Token != term.Token() || !got.Since.Equal(want.Since) {
					t.Errorf("%s: Leaders said %+v for %s, Leader %+v (term token %d)", stage, got, name, want, term.Token())
				}
			}
		}
	}
	check("with seven held")
	resign(t, held[64])
	delete(held, 64)
	resign(t, held[299])
	delete(held, 299)
	check("after two resigned")

	if recs, errs := lr.Leaders(ctx, nil); len(recs) != 0 || len(errs) != 0 {
		t.Errorf("Leaders of no names returned %d records and %d errors, want none", len(recs), len(errs))
	}

	for _, term := range held {
		resign(t, term)
	}
	closeBackend(t, p.Backend)
	if _, err := p.Backend.Leader(ctx, names[0]); !errors.Is(err, baton.ErrClosed) {
		return // Leader answers after Close on this backend; so may Leaders
	}
	_, errs := lr.Leaders(ctx, names[:3])
	for i, err := range errs {
		if !errors.Is(err, baton.ErrClosed) {
			t.Errorf("Leaders on a closed Backend: errs[%d] = %v, want ErrClosed as Leader says", i, err)
		}
	}
}
