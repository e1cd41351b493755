package batontest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/testkit"
)

// stateOf returns term as a StateTerm, or skips or fails the test.
func (s *suite) stateOf(t *testing.T, term baton.Term) baton.StateTerm {
	t.Helper()
	st, ok := term.(baton.StateTerm)
	if !ok {
		if s.target.NoState {
			t.Skip("the backend keeps no lease state (Target.NoState)")
		}
		t.Fatalf("the backend's term %T does not implement baton.StateTerm; implement it or set Target.NoState", term)
	}
	return st
}

func loadState(t *testing.T, st baton.StateTerm) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := st.LoadState(ctx)
	if err != nil {
		t.Fatalf("LoadState (token %d): %v", st.Token(), err)
	}
	return v
}

func storeState(t *testing.T, st baton.StateTerm, v []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.StoreState(ctx, v); err != nil {
		t.Fatalf("StoreState(%q) (token %d): %v", v, st.Token(), err)
	}
}

// stateShared: a lease's state starts empty, survives the hand-over to
// another process, is replaced by the new holder, and is kept per lease.
func (s *suite) stateShared(t *testing.T) {
	a, b := s.target.New(t, s.cfg()), s.target.New(t, s.cfg())
	lease, other := leaseName(t), leaseName(t)

	ta := s.stateOf(t, testkit.CampaignWithin(t, a.Backend, lease, "a", 10*time.Second))
	if v := loadState(t, ta); v != nil {
		t.Fatalf("a new lease's state = %q, want nil", v)
	}
	storeState(t, ta, []byte("first"))
	storeState(t, ta, []byte("from a"))
	if v := loadState(t, ta); string(v) != "from a" {
		t.Fatalf("LoadState after StoreState = %q, want %q", v, "from a")
	}
	big := bytes.Repeat([]byte("x"), baton.MaxStateSize+1)
	if err := ta.StoreState(context.Background(), big); !errors.Is(err, baton.ErrStateTooLarge) {
		t.Errorf("StoreState of %d bytes: %v, want ErrStateTooLarge", len(big), err)
	}
	full := bytes.Repeat([]byte{0, 0xff, '\n'}, baton.MaxStateSize/3)
	storeState(t, ta, full)
	if v := loadState(t, ta); !bytes.Equal(v, full) {
		t.Fatalf("a %d-byte binary state came back as %d bytes", len(full), len(v))
	}
	storeState(t, ta, []byte("from a"))

	// Another lease of the same process has its own state.
	to := s.stateOf(t, testkit.CampaignWithin(t, a.Backend, other, "a", 10*time.Second))
	if v := loadState(t, to); v != nil {
		t.Errorf("another lease's state = %q, want nil: states must be per lease", v)
	}
	storeState(t, to, []byte("other"))
	resign(t, to)

	got := make(chan baton.Term, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tb, err := b.Backend.Campaign(ctx, lease, baton.Candidate{ID: "b"})
		if err != nil {
			t.Errorf("b's campaign: %v", err)
		}
		got <- tb
	}()
	resign(t, ta)
	tb0 := <-got
	if tb0 == nil {
		return
	}
	tb := s.stateOf(t, tb0)
	if v := loadState(t, tb); string(v) != "from a" {
		t.Fatalf("the next holder's LoadState = %q, want its predecessor's %q", v, "from a")
	}
	storeState(t, tb, []byte("from b"))
	if v := loadState(t, tb); string(v) != "from b" {
		t.Fatalf("LoadState = %q, want %q", v, "from b")
	}
	// The ended term may still read, but never write.
	if err := ta.StoreState(context.Background(), []byte("stale")); err == nil {
		t.Errorf("a resigned term stored the lease's state")
	}
	if v := loadState(t, tb); string(v) != "from b" {
		t.Fatalf("after the resigned term's write, LoadState = %q, want %q", v, "from b")
	}
	resign(t, tb)
}

// stateFenced: a holder cut off from the store and replaced cannot write
// once it is back, and the successor's state stands.
func (s *suite) stateFenced(t *testing.T) {
	a, b := s.target.New(t, s.cfg()), s.target.New(t, s.cfg())
	lease := leaseName(t)
	ta := s.stateOf(t, testkit.CampaignWithin(t, a.Backend, lease, "a", 10*time.Second))
	storeState(t, ta, []byte("from a"))

	got := make(chan baton.Term, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tb, err := b.Backend.Campaign(ctx, lease, baton.Candidate{ID: "b"})
		if err != nil {
			t.Errorf("b's campaign: %v", err)
		}
		got <- tb
	}()
	a.Cut()
	// While cut off, a's write cannot be confirmed.
	ctx, cancel := context.WithTimeout(context.Background(), s.ttl/2)
	err := ta.StoreState(ctx, []byte("cut off"))
	cancel()
	if err == nil {
		t.Fatalf("a cut-off holder's StoreState succeeded")
	}
	tb0 := <-got
	if tb0 == nil {
		return
	}
	tb := s.stateOf(t, tb0)
	if v := loadState(t, tb); string(v) != "from a" {
		t.Fatalf("the successor's LoadState = %q, want %q", v, "from a")
	}
	storeState(t, tb, []byte("from b"))
	a.Heal()
	if err := ta.StoreState(context.Background(), []byte("stale")); err == nil {
		t.Errorf("a replaced holder stored the lease's state after healing")
	} else if !errors.Is(err, baton.ErrLeaseLost) && !errors.Is(err, baton.ErrExpired) && !errors.Is(err, baton.ErrClosed) {
		t.Errorf("a replaced holder's StoreState: %v, want an error wrapping its end reason", err)
	}
	if v := loadState(t, tb); string(v) != "from b" {
		t.Fatalf("after the stale write, LoadState = %q, want %q", v, "from b")
	}
	resign(t, tb)
}
