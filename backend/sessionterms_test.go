package backend

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
)

func TestStartExtendEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewSessionTerms(time.Now().Add(time.Second))
		term, ok := s.Start("a", 7, nil)
		if !ok {
			t.Fatal("Start refused on a live session")
		}
		until := time.Now().Add(3 * time.Second)
		s.Extend(until)
		if !term.SafeUntil().Equal(until) {
			t.Fatalf("term safe until %v after Extend(%v)", term.SafeUntil(), until)
		}
		boom := errors.New("boom")
		if !s.End(boom) || s.End(boom) {
			t.Fatal("End reports ended twice, or not at all")
		}
		if !errors.Is(term.Err(), boom) || !errors.Is(s.Err(), boom) {
			t.Fatalf("term err %v, session err %v; want boom", term.Err(), s.Err())
		}
		if _, ok := s.Start("b", 8, nil); ok {
			t.Fatal("Start on an ended session")
		}
	})
}

func TestStartRefusedPastSafeUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewSessionTerms(time.Now().Add(time.Second))
		time.Sleep(time.Second)
		if _, ok := s.Start("a", 1, nil); ok {
			t.Fatal("Start after safe-until")
		}
	})
}

func TestKeepAliveExtendsThenExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		s := NewSessionTerms(time.Now().Add(ttl))
		term, _ := s.Start("a", 1, nil)
		failing := errors.New("unreachable")
		renewals, failures := 0, 0
		var expiredWith error
		s.keepAlive(context.Background(), renewal{
			Interval: time.Second,
			Renew: func(context.Context) (time.Time, error) {
				renewals++
				if renewals <= 2 {
					return time.Now().Add(ttl), nil
				}
				return time.Time{}, failing
			},
			Gone:    func(error) bool { return false },
			Expired: func(lastErr error) { expiredWith = lastErr },
			Lost:    func(error) { t.Error("Lost called for an error that is not Gone") },
			Failed:  func(error, time.Duration) { failures++ },
		})
		if !errors.Is(expiredWith, failing) {
			t.Fatalf("Expired with %v, want the last renewal error", expiredWith)
		}
		if failures < 2 {
			t.Fatalf("%d failed renewals reported before expiry, want retries", failures)
		}
		// The term's own timer ends it at safe-until, with the renewal error.
		<-term.Done()
		if !errors.Is(term.Err(), baton.ErrExpired) || !errors.Is(term.Err(), failing) {
			t.Fatalf("term err %v, want ErrExpired wrapping the renewal error", term.Err())
		}
	})
}

func TestKeepAliveLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewSessionTerms(time.Now().Add(3 * time.Second))
		gone := errors.New("no such session")
		var lost error
		s.keepAlive(context.Background(), renewal{
			Interval: time.Second,
			Renew:    func(context.Context) (time.Time, error) { return time.Time{}, gone },
			Gone:     func(err error) bool { return errors.Is(err, gone) },
			Expired:  func(error) { t.Error("Expired called; want Lost") },
			Lost:     func(err error) { lost = err },
			Failed:   func(error, time.Duration) { t.Error("Failed called; want Lost") },
		})
		if !errors.Is(lost, gone) {
			t.Fatalf("Lost with %v, want %v", lost, gone)
		}
	})
}

func TestKeepAliveStopsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewSessionTerms(time.Now().Add(time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.keepAlive(ctx, renewal{
				Interval: time.Second,
				Renew:    func(context.Context) (time.Time, error) { return time.Now().Add(time.Hour), nil },
				Gone:     func(error) bool { return false },
				Expired:  func(error) { t.Error("Expired") },
				Lost:     func(error) { t.Error("Lost") },
				Failed:   func(error, time.Duration) { t.Error("Failed") },
			})
		}()
		time.Sleep(5 * time.Second)
		cancel()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("KeepAlive still running after its context ended")
		}
	})
}

// TestKeepAliveRenewsEveryInterval: a renewal confirmed in time is followed
// by the next one an interval later, also when the interval is more than
// half the span (etcd at TTL 2 s: every 1 s, for a safe-until 1.8 s after
// each); after a failure, retries come every interval/4, at most half the
// time left before safe-until apart.
func TestKeepAliveRenewsEveryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const span, interval = 1800 * time.Millisecond, time.Second
		start := time.Now()
		s := NewSessionTerms(start.Add(span))
		var at []time.Duration
		ctx, cancel := context.WithCancel(context.Background())
		failing := errors.New("unreachable")
		s.keepAlive(ctx, renewal{
			Interval: interval,
			Renew: func(context.Context) (time.Time, error) {
				at = append(at, time.Since(start))
				if len(at) == 4 {
					return time.Time{}, failing
				}
				if len(at) == 6 {
					cancel()
				}
				return time.Now().Add(span), nil
			},
			Gone:    func(error) bool { return false },
			Expired: func(error) { t.Error("expired") },
			Lost:    func(error) { t.Error("lost") },
			Failed:  func(error, time.Duration) {},
		})
		want := []time.Duration{1 * time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 4250 * time.Millisecond, 5250 * time.Millisecond}
		if len(at) != len(want) {
			t.Fatalf("renewals at %v, want %v", at, want)
		}
		for i := range want {
			if at[i] != want[i] {
				t.Fatalf("renewals at %v, want %v", at, want)
			}
		}
	})
}

// The terms of a session end at the session's safe-until even when nothing
// else runs (no keepAlive ends the session): the session's one timer ends
// them, re-armed by every extension, and not a moment before.
func TestSessionTermsExpireAtSafeUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewSessionTerms(time.Now().Add(time.Second))
		a, _ := s.Start("a", 1, nil)
		b, _ := s.Start("b", 2, nil)
		until := time.Now().Add(3 * time.Second)
		time.Sleep(500 * time.Millisecond)
		s.Extend(until)
		failing := errors.New("unreachable")
		s.RenewFailed(failing)
		time.Sleep(time.Until(until) - time.Millisecond)
		synctest.Wait()
		if a.Err() != nil || b.Err() != nil {
			t.Fatalf("terms ended before their safe-until: %v, %v", a.Err(), b.Err())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		for _, term := range []*BasicTerm{a, b} {
			select {
			case <-term.Done():
			default:
				t.Fatalf("term %s still running past its safe-until", term.Lease())
			}
			if !errors.Is(term.Err(), baton.ErrExpired) || !errors.Is(term.Err(), failing) {
				t.Fatalf("term %s ended with %v; want baton.ErrExpired wrapping the renewal failure", term.Lease(), term.Err())
			}
		}
		if s.Err() != nil {
			t.Fatalf("session ended with %v; its renewals end it, not its terms' timer", s.Err())
		}
		// A term started after a renewal is timed again.
		s.Extend(time.Now().Add(time.Second))
		c, ok := s.Start("c", 3, nil)
		if !ok {
			t.Fatal("Start refused after a renewal")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !errors.Is(c.Err(), baton.ErrExpired) {
			t.Fatalf("term c: %v; want baton.ErrExpired", c.Err())
		}
	})
}

// A capped term (a lease the store granted the process, not covered by a
// request of its own) keeps its cap through the session's renewals, ends
// at the cap when none lifts it, and follows the renewals once Uncap
// lifts it. A renewal that did not cover its key would otherwise stretch
// the term past the key's expiry on the server.
func TestCappedTermKeepsCapUntilUncap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewSessionTerms(time.Now().Add(10 * time.Second))
		capUntil := time.Now().Add(2 * time.Second)
		capped, ok := s.StartCapped("g", 9, nil, capUntil)
		if !ok {
			t.Fatal("StartCapped refused on a live session")
		}
		free, _ := s.Start("f", 3, nil)
		if !capped.SafeUntil().Equal(capUntil) {
			t.Fatalf("capped term safe until %v, want its cap %v", capped.SafeUntil(), capUntil)
		}
		s.Extend(time.Now().Add(20 * time.Second))
		if !capped.SafeUntil().Equal(capUntil) {
			t.Fatalf("a renewal stretched the capped term to %v past its cap %v", capped.SafeUntil(), capUntil)
		}
		time.Sleep(3 * time.Second)
		if !errors.Is(capped.Err(), baton.ErrExpired) {
			t.Fatalf("capped term past its cap: err %v, want ErrExpired", capped.Err())
		}
		if free.Err() != nil {
			t.Fatalf("the other term ended with the capped one: %v", free.Err())
		}

		second, ok := s.StartCapped("h", 10, nil, time.Now().Add(2*time.Second))
		if !ok {
			t.Fatal("StartCapped refused")
		}
		until := time.Now().Add(15 * time.Second)
		s.Uncap(second, until)
		if !second.SafeUntil().Equal(until) {
			t.Fatalf("uncapped term safe until %v, want %v", second.SafeUntil(), until)
		}
		s.Extend(time.Now().Add(19 * time.Second))
		if !second.SafeUntil().Equal(free.SafeUntil()) {
			t.Fatalf("uncapped term safe until %v, the session's other term %v: want the same", second.SafeUntil(), free.SafeUntil())
		}
		s.End(errors.New("done"))
	})
}
