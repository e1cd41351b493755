package dynamodb_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// TestStandbyReadsInBatches: a process waiting for 150 leases that
// another process holds reads them with one BatchGetItem per 100 lease
// items and one for the holder's session item per poll, not two GetItems
// per lease per poll (300 requests a poll). The holder's renewals, counted
// at its proxy, are the clock: a poll comes once per renew interval.
func TestStandbyReadsInBatches(t *testing.T) {
	const n = 150
	d, table := startTable(t)
	cfg := backend.Config{TTL: 3 * time.Second} // renewals and polls every second
	holderP := startFaultProxy(t, d.Endpoint)
	holder := newBackend(t, clientVia(holderP.Endpoint(), 3), table, cfg)
	prefix := testkit.Unique("standby")
	name := func(i int) string { return fmt.Sprintf("%s-%03d", prefix, i) }
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			term := testkit.CampaignWithin(t, holder, name(i), "holder", time.Minute)
			t.Cleanup(func() { _ = term.Resign(context.Background()) })
		})
	}
	wg.Wait()

	waiterP := startFaultProxy(t, d.Endpoint)
	waiter := newBackend(t, clientVia(waiterP.Endpoint(), 3), table, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	won := make(chan string, n)
	for i := range n {
		wg.Go(func() {
			// A campaign that found DynamoDB unavailable (a request over
			// its TTL-long bound on a loaded machine) is tried again, as
			// Elector.Run does.
			var bo baton.Backoff
			for ctx.Err() == nil {
				term, err := waiter.Campaign(ctx, name(i), baton.Candidate{ID: "waiter"})
				if err == nil {
					won <- name(i)
					_ = term.Resign(context.Background())
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(bo.Next()):
				}
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	reads := func() (single, batch int) { return waiterP.count("GetItem"), waiterP.count("BatchGetItem") }
	// Each campaign reads its lease by itself first: its item and the
	// holder's session item.
	testkit.Eventually(t, time.Minute, "the waiters' first reads", func() bool { s, _ := reads(); return s >= 2*n })
	single0, batch0 := reads()
	renewals0 := holderP.count("UpdateItem")
	const polls = 6
	testkit.Eventually(t, time.Minute, "six renewals of the holder", func() bool { return holderP.count("UpdateItem") >= renewals0+polls })
	single, batch := reads()
	single, batch = single-single0, batch-batch0
	select {
	case l := <-won:
		t.Fatalf("the waiter took %s while its holder renewed", l)
	default:
	}
	// Two lease batches (100 + 50) and one session batch per poll, over
	// six renew intervals; two polls more for the edges of the window.
	perPoll := (n+99)/100 + 1
	t.Logf("%d renew intervals: %d GetItem, %d BatchGetItem (%d a poll expected)", polls, single, batch, perPoll)
	if single > n/10 {
		t.Errorf("the waiter sent %d GetItems over %d renew intervals for %d leases; want its polls batched (BatchGetItem), not a read per lease", single, polls, n)
	}
	if batch == 0 || batch > (polls+2)*perPoll {
		t.Errorf("the waiter sent %d BatchGetItems over %d renew intervals; want about %d a poll (one per 100 leases, one for the sessions)", batch, polls, perPoll)
	}
}

// startBatchRefusingProxy is a fault proxy to target that refuses every
// BatchGetItem, as for a role whose policy grants GetItem alone.
func startBatchRefusingProxy(t *testing.T, target string) *faultProxy {
	p := startFaultProxy(t, target)
	p.set(func(op string, _ []byte) action {
		if op == "BatchGetItem" {
			return deny
		}
		return pass
	})
	return p
}

// TestBatchRefusedReadsAlone: a role that may not BatchGetItem (a policy
// that grants GetItem alone) still waits and takes a released lease,
// reading it with GetItem; the refused batch is not tried again.
func TestBatchRefusedReadsAlone(t *testing.T) {
	d, table := startTable(t)
	cfg := backend.Config{TTL: 3 * time.Second}
	holder := newBackend(t, newClient(d.Endpoint), table, cfg)
	lease := testkit.Unique("refused")
	term := testkit.Campaign(t, holder, lease, "holder")
	p := startBatchRefusingProxy(t, d.Endpoint)
	waiter := newBackend(t, newClient(p.Endpoint()), table, cfg)
	got := testkit.CampaignAsync(t, waiter, lease, "waiter")
	testkit.Eventually(t, time.Minute, "a refused batch", func() bool { return p.count("BatchGetItem") >= 1 })
	before := p.count("GetItem")
	testkit.Eventually(t, time.Minute, "the waiter to poll alone", func() bool { return p.count("GetItem") >= before+4 })
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := testkit.WaitTerm(t, got, time.Minute)
	if c := p.count("BatchGetItem"); c != 1 {
		t.Errorf("%d BatchGetItems refused; want one, then reads by GetItem", c)
	}
	_ = w.Term.Resign(context.Background())
}

// TestLeadersBatchRefused: Leaders through a role that may not
// BatchGetItem answers what Leader answers, from GetItems.
func TestLeadersBatchRefused(t *testing.T) {
	d, table := startTable(t)
	cfg := backend.Config{TTL: 3 * time.Second}
	holder := newBackend(t, newClient(d.Endpoint), table, cfg)
	names := []string{testkit.Unique("refused-a"), testkit.Unique("refused-b")}
	term := testkit.Campaign(t, holder, names[0], "holder")
	p := startBatchRefusingProxy(t, d.Endpoint)
	reader := newBackend(t, newClient(p.Endpoint()), table, cfg)
	recs, errs := reader.Leaders(testkit.Context(t, 30*time.Second), names)
	if errs[0] != nil || recs[0].Holder != "holder" || recs[0].Token != term.Token() {
		t.Errorf("Leaders of %s, held by holder with token %d: %+v, %v", names[0], term.Token(), recs[0], errs[0])
	}
	if !errors.Is(errs[1], baton.ErrNoLeader) {
		t.Errorf("Leaders of %s, held by nobody: %+v, %v; want ErrNoLeader", names[1], recs[1], errs[1])
	}
	if p.count("BatchGetItem") == 0 || p.count("GetItem") == 0 {
		t.Errorf("%d BatchGetItems and %d GetItems; want the refused batch, then GetItems", p.count("BatchGetItem"), p.count("GetItem"))
	}
}
