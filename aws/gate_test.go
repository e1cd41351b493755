package aws

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// fakeState is an instance whose InService the test sets.
type fakeState struct {
	mu      sync.Mutex
	in      bool
	changed chan struct{}
	leaving chan struct{}
}

func newFakeState(in bool) *fakeState {
	return &fakeState{in: in, changed: make(chan struct{}), leaving: make(chan struct{})}
}

func (f *fakeState) InService() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.in
}

func (f *fakeState) InServiceChanged() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *fakeState) Leaving() <-chan struct{} { return f.leaving }

func (f *fakeState) set(in bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.in != in {
		f.in = in
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// parked is what the gate logs when a campaign waits for InService.
const parked = "instance not InService: not campaigning until it is"

// TestGateCampaignsOnlyInService: through the gate, an Elector does not
// campaign while its instance is out of service; once it is, it leads and
// its instance carries the leader tag; when the instance leaves service
// the work is stopped first and only then is the lease released, to the
// other candidate; the term keeps its lease state (cron's slots); the
// Elector does not campaign again until the instance is back, and Wait
// returns once the tag is gone.
func TestGateCampaignsOnlyInService(t *testing.T) {
	t.Parallel()
	f := webGroup(t, "i-a", "i-b")
	store := memory.NewStore()
	newBackend := func() baton.Backend {
		b, err := memory.New(store, memory.Options{Config: backend.Config{TTL: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	st := newFakeState(false)
	logs := new(testserver.SyncBuffer)
	gate := NewGate(st, GateOptions{Tagger: newTestTagger(t, f.URL(), "i-a"), Logger: slog.New(slog.NewTextHandler(logs, nil))})
	e, err := baton.NewElector(gate.Backend(newBackend()), baton.ElectorConfig{Lease: "work", Candidate: baton.Candidate{ID: "gated"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type termInfo struct {
		state   bool
		stopped time.Time
	}
	terms := make(chan termInfo, 4)
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, func(ctx context.Context, term baton.Term) error {
			_, isState := term.(baton.StateTerm)
			<-ctx.Done()
			time.Sleep(100 * time.Millisecond) // work that takes a moment to stop
			terms <- termInfo{state: isState, stopped: time.Now()}
			return nil
		})
	}()

	// Out of service, alone: the campaign waits for InService, and nobody
	// leads.
	other := newBackend()
	testkit.Eventually(t, 10*time.Second, "the campaign to wait for InService", func() bool { return strings.Count(logs.String(), parked) == 1 })
	if _, err := other.Leader(t.Context(), "work"); !errors.Is(err, baton.ErrNoLeader) {
		t.Fatalf("out of service, yet the lease is held (%v)", err)
	}

	st.set(true)
	testkit.Eventually(t, 10*time.Second, "the gated candidate to lead", func() bool { return e.Status().Leader })
	testkit.Eventually(t, 10*time.Second, "the leader tag on i-a", func() bool {
		return f.Tags("i-a")[leaderKey] == "true" && f.Tags("i-a")[leaderKey+"-token"] != ""
	})

	// Another candidate waits; the instance leaves service.
	won := make(chan time.Time, 1)
	go func() {
		term, err := other.Campaign(ctx, "work", baton.Candidate{ID: "other"})
		if err == nil {
			won <- time.Now()
			_ = term.Resign(context.Background())
		}
	}()
	st.set(false)
	var ti termInfo
	select {
	case ti = <-terms:
	case <-time.After(10 * time.Second):
		t.Fatal("the work did not stop when the instance left service")
	}
	if !ti.state {
		t.Error("the gated term hides baton.StateTerm")
	}
	select {
	case at := <-won:
		if at.Before(ti.stopped) {
			t.Errorf("the other candidate won at %s, before the work stopped at %s", at, ti.stopped)
		}
		if d := at.Sub(ti.stopped); d > time.Second {
			t.Errorf("the other candidate won %s after the work stopped: not on the release (TTL 2s)", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other candidate did not get the lease")
	}
	// The Elector campaigns again, and the gate holds the campaign back.
	testkit.Eventually(t, 10*time.Second, "the next campaign to wait for InService", func() bool { return strings.Count(logs.String(), parked) == 2 })
	if e.Status().Leader {
		t.Error("out of service, and leading again")
	}
	cancel()
	<-done
	gate.Wait()
	if got := f.Tags("i-a"); got[leaderKey] != "" || got[leaderKey+"-token"] != "" {
		t.Errorf("after the term and Wait, i-a still carries the leader tag: %v", got)
	}
}

// leaderOnly is a Backend with Campaign and Leader only.
type leaderOnly struct{ baton.Backend }

// TestGateKeepsLeadersReader: a gated Backend answers Leaders as the
// Backend it gates, out of service too (reads are not gated), whether or
// not that Backend reads many leases at once.
func TestGateKeepsLeadersReader(t *testing.T) {
	store := memory.NewStore()
	mb, err := memory.New(store, memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mb.Close(context.Background()) })
	term := testkit.CampaignWithin(t, mb, "gated-a", "holder", 5*time.Second)
	names := []string{"gated-a", "gated-b"}
	for _, b := range []baton.Backend{mb, leaderOnly{mb}} {
		gb := NewGate(newFakeState(false), GateOptions{}).Backend(b)
		lr, ok := gb.(baton.LeadersReader)
		if !ok {
			t.Fatalf("the gate over %T is no baton.LeadersReader", b)
		}
		recs, errs := lr.Leaders(testkit.Context(t, 5*time.Second), names)
		if errs[0] != nil || recs[0].Holder != "holder" || recs[0].Token != term.Token() || !errors.Is(errs[1], baton.ErrNoLeader) {
			t.Errorf("Leaders through the gate over %T: %+v, %v; want holder, then nobody", b, recs, errs)
		}
	}
}
