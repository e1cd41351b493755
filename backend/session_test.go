package backend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
)

// memServer is an in-memory session server: sessions that expire TTL after
// their last renewal, on the (fake) clock of the test's bubble.
type memServer struct {
	ttl time.Duration

	mu      sync.Mutex
	next    int
	expires map[int]time.Time
	down    bool          // every request fails
	slow    time.Duration // a grant's reply takes this long
	stall   chan struct{} // when not nil, a renewal's reply waits for it to close
	revoked []int
}

var errMemGone = errors.New("no such session")

func (s *memServer) Grant(ctx context.Context) (SessionGrant[int], error) {
	start := time.Now()
	if s.slow > 0 {
		time.Sleep(s.slow)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return SessionGrant[int]{}, errors.New("server down")
	}
	s.next++
	s.expires[s.next] = time.Now().Add(s.ttl)
	return SessionGrant[int]{ID: s.next, SafeUntil: start.Add(s.ttl), TTL: s.ttl, Span: s.ttl}, nil
}

func (s *memServer) Renew(ctx context.Context, id int) (time.Time, error) {
	start := time.Now()
	s.mu.Lock()
	stall := s.stall
	s.mu.Unlock()
	if stall != nil {
		select {
		case <-stall:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return time.Time{}, errors.New("server down")
	}
	if exp, ok := s.expires[id]; !ok || !time.Now().Before(exp) {
		delete(s.expires, id)
		return time.Time{}, errMemGone
	}
	s.expires[id] = time.Now().Add(s.ttl)
	return start.Add(s.ttl), nil
}

func (s *memServer) Revoke(ctx context.Context, id int, _ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return errors.New("server down")
	}
	delete(s.expires, id)
	s.revoked = append(s.revoked, id)
	return nil
}

func (s *memServer) Gone(err error) bool { return errors.Is(err, errMemGone) }

func newMem(t *testing.T) (*memServer, *SessionManager[int]) {
	t.Helper()
	srv := &memServer{ttl: 3 * time.Second, expires: map[int]time.Time{}}
	m := NewSessionManager[int](srv, SessionOptions[int]{
		Backend:      "mem",
		Config:       Config{TTL: 3 * time.Second, RenewInterval: time.Second},
		GrantTimeout: 5 * time.Second,
		AbandonFor:   3 * time.Second,
		Describe:     func(id int) string { return fmt.Sprintf("mem session %d", id) },
		Lost:         "expired on the server",
	})
	return srv, m
}

// newSession returns a SessionManager on a new in-memory server, and its session.
func newSession(t *testing.T) (*memServer, *SessionManager[int], *Session[int]) {
	t.Helper()
	srv, m := newMem(t)
	s, err := m.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return srv, m, s
}

func TestManagerSharesOneSessionAndRenewsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, m, s1 := newSession(t)
		term, ok := s1.Start("a", 1, nil)
		if !ok {
			t.Fatal("Start refused on a new session")
		}
		time.Sleep(10 * time.Second) // ten renewals' worth
		s2, err := m.Session(t.Context())
		if err != nil || s2 != s1 {
			t.Fatalf("second Session = %v, %v; want the first one", s2, err)
		}
		if term.Err() != nil || time.Until(term.SafeUntil()) < 2*time.Second-time.Millisecond {
			t.Fatalf("term after 10 s of renewals: err %v, safe for %v", term.Err(), time.Until(term.SafeUntil()))
		}
		if err := m.Close(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(term.Err(), baton.ErrClosed) {
			t.Fatalf("term after Close: %v, want ErrClosed", term.Err())
		}
		if _, err := m.Session(t.Context()); !errors.Is(err, baton.ErrClosed) {
			t.Fatalf("Session after Close: %v, want ErrClosed", err)
		}
	})
}

func TestManagerExpiresAndRevokes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m, s := newSession(t)
		term, _ := s.Start("a", 1, nil)
		srv.mu.Lock()
		srv.down = true
		srv.mu.Unlock()
		<-s.Context().Done()
		if !errors.Is(term.Err(), baton.ErrExpired) || !errors.Is(s.Err(), baton.ErrExpired) {
			t.Fatalf("term %v, session %v; want ErrExpired", term.Err(), s.Err())
		}
		srv.mu.Lock()
		srv.down = false
		srv.mu.Unlock()
		synctest.Wait()
		time.Sleep(time.Second) // the abandoned session's revoke retries
		srv.mu.Lock()
		revoked := append([]int(nil), srv.revoked...)
		srv.mu.Unlock()
		if len(revoked) != 1 || revoked[0] != s.ID {
			t.Fatalf("revoked %v, want the expired session %d", revoked, s.ID)
		}
		s2, err := m.Session(t.Context())
		if err != nil || s2 == s {
			t.Fatalf("Session after expiry = %v, %v; want a new one", s2, err)
		}
		_ = m.Close(t.Context(), nil)
	})
}

func TestManagerLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m, s := newSession(t)
		srv.mu.Lock()
		delete(srv.expires, s.ID) // the server dropped it
		srv.mu.Unlock()
		<-s.Context().Done()
		if !errors.Is(s.Err(), baton.ErrLeaseLost) {
			t.Fatalf("session dropped by the server: %v, want ErrLeaseLost", s.Err())
		}
		_ = m.Close(t.Context(), nil)
	})
}

func TestManagerSlowGrantRenewedThenRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m := newMem(t)
		srv.slow = 2 * time.Second // more than half the span gone
		s, err := m.Session(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(s.SessionTerms.safeUntil); left < 3*time.Second-time.Millisecond {
			t.Fatalf("a slow grant left %v of a 3 s span: want it renewed before use", left)
		}
		_ = m.Close(t.Context(), nil)
	})
}

func TestManagerCloseOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m, s := newSession(t)
		term, _ := s.Start("a", 1, nil)
		var sawEnded, sawLive bool
		err := m.Close(t.Context(), func(got *Session[int]) error {
			sawEnded = got == s && term.Err() != nil
			sawLive = s.Context().Err() == nil
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !sawEnded || !sawLive {
			t.Fatalf("letGo saw the terms ended %v, the session's context live %v; want both", sawEnded, sawLive)
		}
		if len(srv.revoked) != 1 || srv.revoked[0] != s.ID {
			t.Fatalf("revoked %v at Close, want %d", srv.revoked, s.ID)
		}
		if err := m.Close(t.Context(), nil); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

// A server that grants and renews for ten hours (one that lies, or grants
// more than asked) moves no safe-until past the send time + the client's
// own TTL − DriftMargin, whatever its SessionDriver computed.
func TestManagerBelievesNoServerAboutTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m := newMem(t)
		srv.ttl = 10 * time.Hour
		s, err := m.Session(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		limit := m.o.Config.TTL - m.o.Config.DriftMargin
		term, ok := s.Start("a", 1, nil)
		if !ok {
			t.Fatal("Start refused on a new session")
		}
		if left := time.Until(term.SafeUntil()); left > limit {
			t.Fatalf("after the grant, safe for %s; want at most %s", left, limit)
		}
		time.Sleep(5 * time.Second) // renewals
		if left := time.Until(term.SafeUntil()); term.Err() != nil || left > limit {
			t.Fatalf("after renewals, term %v safe for %s; want at most %s", term.Err(), left, limit)
		}
		srv.mu.Lock()
		srv.down = true
		srv.mu.Unlock()
		<-s.Context().Done()
		if !errors.Is(term.Err(), baton.ErrExpired) {
			t.Fatalf("term %v; want ErrExpired by the client's own TTL", term.Err())
		}
		_ = m.Close(t.Context(), nil)
	})
}

// lagAfterFailedRenewal brings srv down until a renewal of s has failed,
// and returns s's safe-until then, which no renewal has moved since.
func lagAfterFailedRenewal(t *testing.T, srv *memServer, s *Session[int]) time.Time {
	t.Helper()
	srv.mu.Lock()
	srv.down = true
	srv.mu.Unlock()
	time.Sleep(1100 * time.Millisecond) // past the next renewal, every second
	synctest.Wait()
	s.SessionTerms.mu.Lock()
	defer s.SessionTerms.mu.Unlock()
	if s.SessionTerms.lastErr == nil {
		t.Fatal("no renewal failed while the server was down")
	}
	return s.SessionTerms.safeUntil
}

// After a failed renewal, a candidate that campaigns again and again (as
// an Elector does when each term it wins is too short for its StopEarly,
// and it resigns it) gets no term on the lagging session: its campaign
// waits for a confirmed renewal, and its first term is safe until later
// than the lagging session was.
func TestManagerLaggingSessionWaitsForARenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m, s := newSession(t)
		t.Cleanup(func() { _ = m.Close(context.Background(), nil) })
		held, _ := s.Start("a", 1, nil)
		lagging := lagAfterFailedRenewal(t, srv, s)
		held.End(baton.ErrResigned) // the work stopped early; the lease is released
		s.Forget(held)
		time.AfterFunc(time.Second, func() {
			srv.mu.Lock()
			srv.down = false
			srv.mu.Unlock()
		})
		const stopEarly = 2 * time.Second
		for terms := 1; ; terms++ {
			got, err := m.Session(t.Context())
			if err != nil {
				t.Fatalf("campaign %d: %v", terms, err)
			}
			term, ok := got.Start("a", uint64(1+terms), nil)
			if !ok {
				t.Fatalf("campaign %d: Start refused", terms)
			}
			if time.Until(term.SafeUntil()) > stopEarly {
				if terms > 1 || !term.SafeUntil().After(lagging) {
					t.Fatalf("took %d terms, the first safe until the lagging %v; want one, after a renewal",
						terms, lagging.Sub(time.Now()))
				}
				break
			}
			if terms == 10 {
				t.Fatalf("took %d terms, each with less than StopEarly (%s) left, on a session whose renewal failed",
					terms, stopEarly)
			}
			term.End(baton.ErrResigned)
			got.Forget(term)
		}
		_ = m.Close(t.Context(), nil)
	})
}

// When the renewals of a lagging session go on failing, a campaign on it
// waits until the session expires, and then for a new one: it fails with
// baton.ErrBackendUnavailable while the server is down, rather than
// starting a term that could not outlive the old safe-until.
func TestManagerLaggingSessionExpiresUnderACampaign(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m, s := newSession(t)
		t.Cleanup(func() { _ = m.Close(context.Background(), nil) })
		lagging := lagAfterFailedRenewal(t, srv, s)
		got, err := m.Session(t.Context())
		if err == nil {
			t.Fatalf("Session on a lagging session = %v (safe for %v); want it to wait and fail", got.ID, time.Until(lagging))
		}
		if !errors.Is(err, baton.ErrBackendUnavailable) || time.Now().Before(lagging) || s.Err() == nil {
			t.Fatalf("Session = %v at %v before safe-until, old session %v; want ErrBackendUnavailable once it expired",
				err, lagging.Sub(time.Now()), s.Err())
		}
		_ = m.Close(t.Context(), nil)
	})
}

// A renewal that neither fails nor returns leaves the session lagging as
// much as a failed one: once it is overdue (less than half the span less
// an interval left), a campaign waits for its reply, and gets a term only
// from the renewal confirmed then.
func TestManagerOverdueRenewalHoldsCampaigns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, m, s := newSession(t)
		t.Cleanup(func() { _ = m.Close(context.Background(), nil) })
		stall := make(chan struct{})
		srv.mu.Lock()
		srv.stall = stall
		srv.mu.Unlock()
		time.Sleep(2100 * time.Millisecond) // the renewal sent at 1 s hangs; 0.9 s left of a 3 s span
		old := s.SessionTerms.safeUntil
		released := time.Now().Add(300 * time.Millisecond)
		time.AfterFunc(300*time.Millisecond, func() {
			srv.mu.Lock()
			srv.stall = nil
			srv.mu.Unlock()
			close(stall)
		})
		got, err := m.Session(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		term, ok := got.Start("a", 1, nil)
		if !ok {
			t.Fatal("Start refused")
		}
		if time.Now().Before(released) || !term.SafeUntil().After(old) {
			t.Fatalf("a term started %v before the overdue renewal's reply, safe until %v (the lagging safe-until: %v); want one after it, safe for longer",
				released.Sub(time.Now()), time.Until(term.SafeUntil()), time.Until(old))
		}
	})
}
