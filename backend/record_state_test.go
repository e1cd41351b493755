package backend_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/internal/testkit"
)

// TestStoreStateFencedByStore: the record is taken over behind the holder's
// back (by another holder, or by another process with the same candidate
// ID); the holder, which has not noticed, cannot overwrite the new state,
// and neither can its renewals.
func TestStoreStateFencedByStore(t *testing.T) {
	for _, intruder := range []string{"b", "a"} {
		t.Run("by "+intruder, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				a := newBackend(t, store, cfg)
				term, err := a.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
				if err != nil {
					t.Fatal(err)
				}
				ta := testkit.StateTerm(t, term)
				if err := ta.StoreState(t.Context(), []byte("from a")); err != nil {
					t.Fatal(err)
				}
				rec, v, _ := store.Get(t.Context(), "l")
				rec.Holder, rec.Token, rec.State = intruder, rec.Token+1, []byte("theirs")
				if _, err := store.CompareAndSwap(t.Context(), "l", v, rec); err != nil {
					t.Fatal(err)
				}
				// No time passes in the bubble, so no renewal has run.
				if err := ta.Err(); err != nil {
					t.Fatalf("the term ended (%v) before its write: the test needs a holder unaware of its loss", err)
				}
				err = ta.StoreState(t.Context(), []byte("stale"))
				if !errors.Is(err, baton.ErrLeaseLost) {
					t.Fatalf("StoreState over a record taken over: %v, want ErrLeaseLost", err)
				}
				if !errors.Is(ta.Err(), baton.ErrLeaseLost) {
					t.Errorf("Err() = %v, want ErrLeaseLost", ta.Err())
				}
				time.Sleep(2 * cfg.TTL) // the renewer would have written by now
				synctest.Wait()
				got, _, _ := store.Get(t.Context(), "l")
				if got.Holder != intruder || string(got.State) != "theirs" {
					t.Errorf("record = %+v, want the intruder's, state %q", got, "theirs")
				}
				if v, err := ta.LoadState(t.Context()); err != nil || string(v) != "theirs" {
					t.Errorf("the lost term's LoadState = %q, %v; want %q", v, err, "theirs")
				}
				_ = ta.Resign(t.Context())
				if got, _, _ := store.Get(t.Context(), "l"); got.Holder != intruder {
					t.Errorf("the lost term's Resign released someone else's record: %+v", got)
				}
			})
		})
	}
}

// TestStateKeptByEveryWrite: renewals, releases and acquisitions carry the
// state on, and the store keeps its own copy of it.
func TestStateKeptByEveryWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		a := newBackend(t, store, cfg)
		term, err := a.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		ta := testkit.StateTerm(t, term)
		if v, err := ta.LoadState(t.Context()); err != nil || v != nil {
			t.Fatalf("a new lease's state = %#v, %v; want nil", v, err)
		}
		value := []byte("slot 1")
		if err := ta.StoreState(t.Context(), value); err != nil {
			t.Fatal(err)
		}
		copy(value, "XXXX") // the caller's slice is the caller's
		_, v0, _ := store.Get(t.Context(), "l")
		time.Sleep(2 * cfg.TTL)
		synctest.Wait()
		rec, v1, _ := store.Get(t.Context(), "l")
		if v1 == v0 || rec.Holder != "a" || string(rec.State) != "slot 1" {
			t.Fatalf("after renewals record = %+v (version %d, was %d), want renewed with state %q", rec, v1, v0, "slot 1")
		}
		rec.State[0] = 'X' // and Get's copy is the reader's
		loaded, _ := ta.LoadState(t.Context())
		loaded[1] = 'X' // and LoadState's copy too
		if err := term.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		if rec, _, _ := store.Get(t.Context(), "l"); rec.Holder != "" || string(rec.State) != "slot 1" {
			t.Fatalf("after release record = %+v, want free with state %q", rec, "slot 1")
		}
		term, err = a.Campaign(t.Context(), "l", baton.Candidate{ID: "b"})
		if err != nil {
			t.Fatal(err)
		}
		tb := testkit.StateTerm(t, term)
		if v, _ := tb.LoadState(t.Context()); string(v) != "slot 1" {
			t.Fatalf("the next holder's LoadState = %q, want %q", v, "slot 1")
		}
		if err := tb.StoreState(t.Context(), []byte{}); err != nil {
			t.Fatal(err)
		}
		if v, _ := tb.LoadState(t.Context()); v == nil || len(v) != 0 {
			t.Errorf("LoadState after storing an empty value = %#v, want empty, not nil", v)
		}
		_ = tb.Resign(t.Context())
	})
}

// TestLostStateReplyIsAdopted: a StoreState that landed but lost its reply
// reports that the outcome is unknown; the renewer then finds the record
// moved under it, recognises its own write, and keeps the term and the
// stored state.
func TestLostStateReplyIsAdopted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &faultStore{Store: memory.NewStore()}
		b := newBackend(t, f, cfg)
		term, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		ta := testkit.StateTerm(t, term)
		f.loseCAS.Store(1)
		err = ta.StoreState(t.Context(), []byte("landed"))
		if !errors.Is(err, baton.ErrBackendUnavailable) || errors.Is(err, baton.ErrLeaseLost) {
			t.Fatalf("StoreState whose reply was lost: %v, want ErrBackendUnavailable", err)
		}
		for range 6 {
			time.Sleep(cfg.TTL / 3)
			synctest.Wait()
		}
		if err := ta.Err(); err != nil {
			t.Fatalf("the term ended after a lost StoreState reply: %v", err)
		}
		if v, _ := ta.LoadState(t.Context()); string(v) != "landed" {
			t.Fatalf("state after renewals = %q, want the landed write's %q", v, "landed")
		}
		// And a StoreState right after a lost one writes on top of it.
		f.loseCAS.Store(1)
		_ = ta.StoreState(t.Context(), []byte("lost again"))
		if err := ta.StoreState(t.Context(), []byte("next")); err != nil {
			t.Fatalf("StoreState after a lost one: %v", err)
		}
		if v, _ := ta.LoadState(t.Context()); string(v) != "next" {
			t.Fatalf("state = %q, want %q", v, "next")
		}
		_ = term.Resign(t.Context())
		if rec, _, _ := f.Store.Get(t.Context(), "l"); rec.Holder != "" || string(rec.State) != "next" {
			t.Errorf("after release record = %+v, want free with state %q", rec, "next")
		}
	})
}

// storeCtxKey marks the context of the test's StoreState calls, so that
// writeCounter can tell them from the Backend's own writes.
type storeCtxKey struct{}

// writeCounter is a real store whose replies are a little slow, which
// counts the writes the Backend makes by itself: renewals, mostly.
type writeCounter struct {
	*memory.Store
	own atomic.Int64
}

func (w *writeCounter) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	v, err := w.Store.CompareAndSwap(ctx, name, version, rec)
	if ctx.Value(storeCtxKey{}) == nil {
		w.own.Add(1)
	}
	time.Sleep(time.Millisecond) // widen the window in which writes overlap
	return v, err
}

// value is a state whose every 8 bytes repeat n, so that a torn or mixed
// value shows.
func value(n uint64) []byte {
	v := make([]byte, 512)
	for i := 0; i < len(v); i += 8 {
		binary.BigEndian.PutUint64(v[i:], n)
	}
	return v
}

// valueOf returns the n of value(n), or reports v as garbled and returns 0.
func valueOf(t *testing.T, v []byte) uint64 {
	t.Helper()
	if len(v) != 512 {
		t.Errorf("state of %d bytes, want 512", len(v))
		return 0
	}
	n := binary.BigEndian.Uint64(v)
	if !bytes.Equal(v, value(n)) {
		t.Errorf("garbled state: %x", v)
		return 0
	}
	return n
}

// TestStoreStateRacesRenewals: many StoreStates from several goroutines,
// over several renewals of a short TTL, neither end the term nor lose or
// garble a stored value.
func TestStoreStateRacesRenewals(t *testing.T) {
	w := &writeCounter{Store: memory.NewStore()}
	b := newBackend(t, w, backend.Config{TTL: time.Second})
	term, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	ta := testkit.StateTerm(t, term)
	ctx := context.WithValue(t.Context(), storeCtxKey{}, true)
	start := w.own.Load()
	var (
		next   atomic.Uint64 // the last value handed out
		stores atomic.Int64
		wg     sync.WaitGroup
	)
	deadline := time.Now().Add(time.Minute)
	for range 4 {
		wg.Go(func() {
			// At least 200 stores in all, and on until three renewals
			// happened among them.
			for stores.Load() < 200 || w.own.Load()-start < 3 {
				if time.Now().After(deadline) {
					t.Errorf("after %d stores, only %d renewals in a minute", stores.Load(), w.own.Load()-start)
					return
				}
				n := next.Add(1)
				if err := ta.StoreState(ctx, value(n)); err != nil {
					t.Errorf("StoreState #%d: %v", n, err)
					return
				}
				stores.Add(1)
				v, err := ta.LoadState(ctx)
				if err != nil {
					t.Errorf("LoadState: %v", err)
					return
				}
				// Others may have stored since, in any order: the value
				// must be whole, and one that was handed out.
				if got := valueOf(t, v); got > next.Load() {
					t.Errorf("LoadState after storing %d = %d, never handed out", n, got)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if err := ta.Err(); err != nil {
		t.Fatalf("the term ended during the stores: %v", err)
	}
	// Every store returned; one more, alone, is what the record must show,
	// through the renewals that follow it.
	last := next.Add(1)
	if err := ta.StoreState(ctx, value(last)); err != nil {
		t.Fatal(err)
	}
	renewals := w.own.Load()
	testkit.Eventually(t, time.Until(deadline), "two renewals after the stores", func() bool {
		return w.own.Load() >= renewals+2
	})
	rec, _, _ := w.Get(t.Context(), "l")
	if rec.Holder != "a" || rec.Token != term.Token() {
		t.Fatalf("record = holder %q token %d, want a's, token %d", rec.Holder, rec.Token, term.Token())
	}
	if got := valueOf(t, rec.State); got != last {
		t.Errorf("stored state = %d after renewals, want the last stored, %d", got, last)
	}
	t.Logf("%d stores, %d renewals among them", stores.Load(), renewals-start)
	if err := term.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
}
