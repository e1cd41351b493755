package backend

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
)

// testSlots is a Backend's mutex, closed flag and slots.
type testSlots struct {
	mu     sync.Mutex
	closed bool
	*slots
}

func newTestSlots() *testSlots {
	b := &testSlots{}
	b.slots = newSlots(&b.mu, func() bool { return b.closed }, "test")
	return b
}

func (b *testSlots) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

func (b *testSlots) won(sl *Slot, t *BasicTerm) {
	b.mu.Lock()
	b.wonLocked(sl, t)
	b.mu.Unlock()
}

func (b *testSlots) wonUntilGone(sl *Slot, t *BasicTerm) {
	b.mu.Lock()
	b.wonUntilGoneLocked(sl, t)
	b.mu.Unlock()
}

func (b *testSlots) cleaning(sl *Slot) (func(), bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cleaningLocked(sl)
}

func (b *testSlots) mustClaim(t *testing.T, name string) *Slot {
	t.Helper()
	sl, err := b.Claim(context.Background(), name, "c")
	if err != nil {
		t.Fatalf("Claim(%q): %v", name, err)
	}
	return sl
}

type claimed struct {
	sl  *Slot
	err error
}

// goClaim claims name in a goroutine, and returns once that goroutine has
// returned or is blocked waiting.
func (b *testSlots) goClaim(ctx context.Context, name string) <-chan claimed {
	return b.goClaimAs(ctx, name, "c2")
}

// goClaimAs is goClaim by candidate id.
func (b *testSlots) goClaimAs(ctx context.Context, name, id string) <-chan claimed {
	ch := make(chan claimed, 1)
	go func() {
		sl, err := b.Claim(ctx, name, id)
		ch <- claimed{sl, err}
	}()
	synctest.Wait()
	return ch
}

func waiting(t *testing.T, ch <-chan claimed) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Claim returned %v, %v; want it waiting", r.sl, r.err)
	default:
	}
}

func running() *BasicTerm {
	return NewBasicTerm("a", 1, time.Now().Add(time.Hour), nil)
}

func TestSlotsClaimUnclaim(t *testing.T) {
	b := newTestSlots()
	a := b.mustClaim(t, "a")
	b.mustClaim(t, "b") // names are independent
	_, err := b.Claim(context.Background(), "a", "c")
	if !errors.Is(err, baton.ErrAlreadyCampaigning) {
		t.Fatalf("second Claim by the same candidate: %v, want ErrAlreadyCampaigning", err)
	}
	want := `lease "a", candidate "c" (test allows one campaign per lease name per candidate)`
	if !strings.Contains(err.Error(), want) {
		t.Errorf("second Claim's error %q lacks %q", err, want)
	}
	b.Unclaim(a)
	if b.Claimed("a") || !b.Claimed("b") {
		t.Fatalf("after Unclaim(a): claimed a %v, b %v; want false, true", b.Claimed("a"), b.Claimed("b"))
	}
	a2 := b.mustClaim(t, "a")
	b.Unclaim(a) // stale: must leave a2's claim alone
	if !b.Claimed("a") {
		t.Fatal("Unclaim of an old slot gave a new slot's name back")
	}
	b.Unclaim(a2)
	if b.Claimed("a") {
		t.Fatal("Unclaim did not give the name back")
	}
}

func TestSlotsWonTakenOverOnceEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		sl := b.mustClaim(t, "a")
		term := running()
		b.won(sl, term)
		if _, err := b.Claim(context.Background(), "a", "c"); !errors.Is(err, baton.ErrAlreadyCampaigning) {
			t.Fatalf("Claim by the holder while its term runs: %v, want ErrAlreadyCampaigning", err)
		}
		ch := b.goClaim(context.Background(), "a")
		waiting(t, ch)
		term.End(baton.ErrLeaseLost)
		r := <-ch
		if r.err != nil || r.sl == sl {
			t.Fatalf("Claim once the term ended: %v, %v; want a new slot", r.sl, r.err)
		}
		b.Unclaim(sl) // the old term's clean-up finishing late
		if !b.Claimed("a") {
			t.Fatal("the old slot's Unclaim gave the new slot's name back")
		}
	})
}

func TestSlotsWonUntilGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		sl := b.mustClaim(t, "a")
		term := running()
		b.wonUntilGone(sl, term)
		ch := b.goClaim(context.Background(), "a")
		waiting(t, ch)
		term.End(baton.ErrLeaseLost)
		synctest.Wait()
		waiting(t, ch)
		b.Unclaim(sl) // not what ends the wait: the name is kept until Gone
		if !b.Claimed("a") {
			t.Fatal("Unclaim gave back a name won until Gone")
		}
		synctest.Wait()
		waiting(t, ch)
		b.Gone(sl)
		r := <-ch
		if r.err != nil || r.sl == nil || r.sl == sl {
			t.Fatalf("Claim after Gone: %v, %v; want a new slot", r.sl, r.err)
		}
	})
}

func TestSlotsCleaning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		sl := b.mustClaim(t, "a")
		done, ok := b.cleaning(sl)
		if !ok {
			t.Fatal("cleaningLocked refused the name's slot")
		}
		if _, ok := b.cleaning(sl); ok {
			t.Fatal("cleaningLocked marked a slot already being cleaned up after")
		}
		b.Unclaim(sl)
		if !b.Claimed("a") {
			t.Fatal("Unclaim gave back a name being cleaned up after")
		}
		// The campaign is over: its candidate may campaign again, and
		// waits for the clean-up like any other.
		ch := b.goClaimAs(context.Background(), "a", "c")
		waiting(t, ch)
		done()
		r := <-ch
		if r.err != nil || r.sl == nil || r.sl == sl {
			t.Fatalf("Claim after the clean-up: %v, %v; want a new slot", r.sl, r.err)
		}
		// A clean-up after a slot that lost its name keeps nothing.
		stale, ok := b.cleaning(sl)
		if ok {
			t.Fatal("cleaningLocked marked a slot that no longer holds its name")
		}
		stale()
		if !b.Claimed("a") {
			t.Fatal("a stale clean-up gave the new slot's name back")
		}
	})
}

func TestSlotsCleaningEndsWonTerm(t *testing.T) {
	// A term whose clean-up runs after it ended (etcd's, ZooKeeper's
	// failed release) keeps its name until the clean-up is over.
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		sl := b.mustClaim(t, "a")
		term := running()
		b.won(sl, term)
		term.End(baton.ErrResigned)
		done, ok := b.cleaning(sl)
		if !ok {
			t.Fatal("cleaningLocked refused the name's slot")
		}
		ch := b.goClaim(context.Background(), "a")
		waiting(t, ch)
		done()
		if r := <-ch; r.err != nil {
			t.Fatalf("Claim after the clean-up: %v", r.err)
		}
	})
}

func TestSlotsClaimCanceledWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		cleaned := b.mustClaim(t, "a")
		done, _ := b.cleaning(cleaned)
		ended := b.mustClaim(t, "b")
		term := running()
		b.wonUntilGone(ended, term)
		term.End(baton.ErrLeaseLost)
		for _, name := range []string{"a", "b"} {
			ctx, cancel := context.WithCancel(context.Background())
			ch := b.goClaim(ctx, name)
			waiting(t, ch)
			cancel()
			if r := <-ch; r.err != context.Canceled {
				t.Errorf("Claim(%q) canceled while waiting: %v, %v; want context.Canceled", name, r.sl, r.err)
			}
			if !b.Claimed(name) {
				t.Errorf("a canceled Claim gave %q back", name)
			}
		}
		done()
		b.Gone(ended)
		b.mustClaim(t, "a")
		b.mustClaim(t, "b")
	})
}

func TestSlotsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		sl := b.mustClaim(t, "a")
		done, _ := b.cleaning(sl)
		ch := b.goClaim(context.Background(), "a")
		waiting(t, ch)
		b.close()
		done()
		if r := <-ch; r.err != baton.ErrClosed {
			t.Errorf("Claim waiting as the Backend closed: %v, %v; want baton.ErrClosed", r.sl, r.err)
		}
		if _, err := b.Claim(context.Background(), "b", "c"); err != baton.ErrClosed {
			t.Errorf("Claim after close: %v, want baton.ErrClosed", err)
		}
	})
}

// Campaign gives the name back when the campaign fails, and keeps it for
// the term when it wins.
func TestSlotsCampaign(t *testing.T) {
	b := newTestSlots()
	boom := errors.New("boom")
	if _, err := b.Campaign(context.Background(), "a", "c", func(*Slot) (baton.Term, error) {
		if !b.Claimed("a") {
			t.Error("the name is not claimed during the campaign")
		}
		return nil, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Campaign = %v, want the campaign's error", err)
	}
	if b.Claimed("a") {
		t.Fatal("a failed campaign kept the name")
	}
	term := running()
	got, err := b.Campaign(context.Background(), "a", "c", func(sl *Slot) (baton.Term, error) {
		b.won(sl, term)
		return term, nil
	})
	if err != nil || got != term {
		t.Fatalf("Campaign = %v, %v; want the term", got, err)
	}
	if !b.Claimed("a") {
		t.Fatal("a won campaign gave the name back")
	}
}

// The candidates of one Backend for one name take turns, first come, first
// served; a candidate cancelled while waiting leaves the line, whether it
// was first in it or not, and the line goes once nobody waits.
func TestSlotsCandidatesTakeTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		sl := b.mustClaim(t, "a") // candidate c campaigns
		cancels := map[string]context.CancelFunc{}
		chs := map[string]<-chan claimed{}
		for _, id := range []string{"w1", "w2", "w3", "w4"} {
			ctx, cancel := context.WithCancel(context.Background())
			cancels[id] = cancel
			chs[id] = b.goClaimAs(ctx, "a", id)
			waiting(t, chs[id])
		}
		if _, err := b.Claim(context.Background(), "a", "w2"); !errors.Is(err, baton.ErrAlreadyCampaigning) {
			t.Fatalf("Claim by a candidate already waiting: %v, want ErrAlreadyCampaigning", err)
		}
		// w1 is first in line, waiting for c's campaign; w3 is in the middle.
		cancels["w1"]()
		cancels["w3"]()
		for _, id := range []string{"w1", "w3"} {
			if r := <-chs[id]; r.err != context.Canceled {
				t.Fatalf("%s canceled while waiting: %v, %v; want context.Canceled", id, r.sl, r.err)
			}
		}
		synctest.Wait()
		waiting(t, chs["w2"])
		waiting(t, chs["w4"])
		term := running()
		b.won(sl, term) // c holds: w2 waits for its term
		synctest.Wait()
		waiting(t, chs["w2"])
		term.End(baton.ErrResigned)
		r := <-chs["w2"]
		if r.err != nil {
			t.Fatalf("w2 once c's term ended: %v", r.err)
		}
		synctest.Wait()
		waiting(t, chs["w4"]) // w2's campaign runs
		b.Unclaim(r.sl)
		if r := <-chs["w4"]; r.err != nil || r.sl.id != "w4" {
			t.Fatalf("w4 once w2 gave the name back: %v, %v", r.sl, r.err)
		}
		b.mu.Lock()
		n := len(b.lines)
		b.mu.Unlock()
		if n != 0 {
			t.Errorf("%d lines left with nobody waiting", n)
		}
		for _, cancel := range cancels {
			cancel()
		}
	})
}

// A claim waiting for a term that its holder resigns takes the name only
// once the release returned: until then the store may still hold the lease
// for the session, and a campaign on it could take the term's place and
// token.
func TestSlotsWaitForRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTestSlots()
		sl := b.mustClaim(t, "a")
		releasing, release := make(chan struct{}), make(chan struct{})
		term := NewBasicTerm("a", 1, time.Now().Add(time.Hour), func(context.Context) error {
			close(releasing)
			<-release
			return nil
		})
		b.won(sl, term)
		ch := b.goClaim(context.Background(), "a")
		resigned := make(chan error, 1)
		go func() { resigned <- term.Resign(context.Background()) }()
		<-releasing
		synctest.Wait()
		waiting(t, ch)
		close(release)
		if r := <-ch; r.err != nil || r.sl == sl {
			t.Fatalf("Claim once the release returned: %v, %v; want a new slot", r.sl, r.err)
		}
		if err := <-resigned; err != nil {
			t.Fatal(err)
		}
	})
}
