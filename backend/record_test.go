package backend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
)

var errReplyLost = errors.New("test: reply lost")

// faultStore wraps a real in-memory store and injects faults into replies:
// the operation still happens on the store, only its answer goes astray.
type faultStore struct {
	*memory.Store
	loseCAS  atomic.Int32 // lose the reply of the next N compare-and-swaps
	slow     atomic.Int64 // delay every reply by this many nanoseconds
	down     atomic.Bool  // fail without touching the store
	mu       sync.Mutex
	casCalls int
}

func (f *faultStore) reply(ctx context.Context) error {
	if d := time.Duration(f.slow.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (f *faultStore) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	if f.down.Load() {
		return backend.LeaseRecord{}, 0, errReplyLost
	}
	r, v, err := f.Store.Get(ctx, name)
	if rerr := f.reply(ctx); rerr != nil {
		return backend.LeaseRecord{}, 0, rerr
	}
	return r, v, err
}

func (f *faultStore) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	if f.down.Load() {
		return 0, errReplyLost
	}
	f.mu.Lock()
	f.casCalls++
	f.mu.Unlock()
	v, err := f.Store.CompareAndSwap(ctx, name, version, rec)
	if err == nil && f.loseCAS.Load() > 0 {
		f.loseCAS.Add(-1)
		return 0, errReplyLost
	}
	if rerr := f.reply(ctx); rerr != nil {
		return 0, rerr
	}
	return v, err
}

func newBackend(t *testing.T, s backend.RecordStore, cfg backend.Config) *backend.RecordBackend {
	t.Helper()
	b, err := backend.NewRecordBackend(s, backend.RecordOptions{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

var cfg = backend.Config{TTL: 3 * time.Second}

func TestLostAcquireReplyIsAdopted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &faultStore{Store: memory.NewStore()}
		b := newBackend(t, f, cfg)
		f.loseCAS.Store(1)
		term, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatalf("campaign whose acquiring write landed but lost its reply: %v", err)
		}
		if term.Token() != 1 {
			t.Errorf("token = %d, want 1", term.Token())
		}
		rec, _, _ := f.Store.Get(t.Context(), "l")
		if rec.Holder != "a" || rec.Token != 1 {
			t.Errorf("record = %+v, want holder a token 1", rec)
		}
		_ = term.Resign(t.Context())
	})
}

func TestLostRenewalReplyIsAdopted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &faultStore{Store: memory.NewStore()}
		b := newBackend(t, f, cfg)
		term, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		f.loseCAS.Store(2) // two renewals in a row land but lose their replies
		// Run through several renew intervals: the term must survive, with its
		// deadline kept moving by the adopted renewals.
		for range 6 {
			time.Sleep(cfg.TTL / 3)
			synctest.Wait()
		}
		if err := term.Err(); err != nil {
			t.Fatalf("term ended after lost renewal replies: %v", err)
		}
		if f.loseCAS.Load() != 0 {
			t.Fatalf("the fault was never exercised")
		}
		if left := time.Until(term.SafeUntil()); left < cfg.TTL/2 {
			t.Errorf("safe-until only %s away after renewals resumed", left)
		}
		rec, _, _ := f.Store.Get(t.Context(), "l")
		if rec.Holder != "a" || rec.Token != term.Token() {
			t.Errorf("record = %+v, want still held by a with token %d", rec, term.Token())
		}
		_ = term.Resign(t.Context())
	})
}

func TestSlowRepliesEndTermBySafeUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &faultStore{Store: memory.NewStore()}
		b := newBackend(t, f, cfg)
		term, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		f.slow.Store(int64(10 * cfg.TTL)) // every reply now arrives too late
		<-term.Done()
		if late := time.Since(term.SafeUntil()); late > 0 {
			t.Errorf("term ended %s after safe-until", late)
		}
		if !errors.Is(term.Err(), baton.ErrExpired) {
			t.Errorf("Err = %v, want ErrExpired", term.Err())
		}
		// The writes did land: a waiting contender's view is what decides.
		f.slow.Store(0)
	})
}

func TestTakeoverWaitsFullTTLOnObserversClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		fa := &faultStore{Store: store}
		a := newBackend(t, fa, cfg)
		b := newBackend(t, store, cfg)
		ta, err := a.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(cfg.TTL) // a renews a few times
		fa.down.Store(true)
		cut := time.Now()
		// The last renewal landed at most one renew interval before the cut.
		full, _ := cfg.WithDefaults()
		lastRenewal := cut.Add(-full.RenewInterval)
		tb, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "b"})
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(lastRenewal); waited < cfg.TTL {
			t.Errorf("b took over %s after a's last renewal; must wait a full TTL (%s)", waited, cfg.TTL)
		}
		select {
		case <-ta.Done():
		default:
			t.Fatalf("b acquired while a's term was still running")
		}
		if tb.Token() != ta.Token()+1 {
			t.Errorf("b's token = %d, want %d", tb.Token(), ta.Token()+1)
		}
		_ = tb.Resign(t.Context())
	})
}

func TestContenderHonoursHoldersLongerTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		fa := &faultStore{Store: store}
		long := backend.Config{TTL: 30 * time.Second}
		a := newBackend(t, fa, long)
		b := newBackend(t, store, backend.Config{TTL: time.Second})
		if _, err := a.Campaign(t.Context(), "l", baton.Candidate{ID: "a"}); err != nil {
			t.Fatal(err)
		}
		fa.down.Store(true)
		start := time.Now()
		tb, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "b"})
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited < long.TTL {
			t.Errorf("b took over after %s; the holder's recorded TTL is %s", waited, long.TTL)
		}
		_ = tb.Resign(t.Context())
	})
}

func TestReleaseKeepsToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newBackend(t, store, cfg)
		for want := uint64(1); want <= 3; want++ {
			term, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
			if err != nil {
				t.Fatal(err)
			}
			if term.Token() != want {
				t.Fatalf("token = %d, want %d", term.Token(), want)
			}
			if err := term.Resign(t.Context()); err != nil {
				t.Fatal(err)
			}
			rec, _, _ := store.Get(t.Context(), "l")
			if rec.Holder != "" || rec.Token != want {
				t.Fatalf("after release record = %+v, want no holder and token %d", rec, want)
			}
		}
	})
}

func TestSameIDInAnotherProcessWaitsTTL(t *testing.T) {
	// Two processes misconfigured with one ID must not both lead.
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		a := newBackend(t, store, cfg)
		b := newBackend(t, store, cfg)
		ta, err := a.Campaign(t.Context(), "l", baton.Candidate{ID: "same"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*cfg.TTL)
		defer cancel()
		if tb, err := b.Campaign(ctx, "l", baton.Candidate{ID: "same"}); err == nil {
			t.Fatalf("second process with the same ID acquired token %d while the first held %d", tb.Token(), ta.Token())
		}
		_ = ta.Resign(t.Context())
	})
}

// What Close does to the terms and to later campaigns, every backend's
// batontest.Run checks (CloseEndsTermsAndRefusesCampaigns); on a record store, Close also
// clears the holder from the record, so that a standby takes over at once.
func TestCloseReleasesTheRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b, err := backend.NewRecordBackend(store, backend.RecordOptions{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"}); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if rec, _, _ := store.Get(t.Context(), "l"); rec.Holder != "" {
			t.Errorf("Close left the record held: %+v", rec)
		}
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	_, err := backend.NewRecordBackend(memory.NewStore(), backend.RecordOptions{Config: backend.Config{TTL: -time.Second, RenewInterval: -1}, PollInterval: -1})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) < 2 {
		t.Fatalf("err = %v; want a ConfigError listing every problem", err)
	}
}

// A term that expired while its store was slow may still be named in the
// record once the store recovers; Resign must clear it rather than leave the
// lease blocked for a TTL (or, on a session backend, for the session's life).
func TestResignAfterExpiryReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &faultStore{Store: memory.NewStore()}
		b := newBackend(t, f, cfg)
		term, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		f.down.Store(true)
		<-term.Done()
		f.down.Store(false)
		if err := term.Resign(t.Context()); err != nil {
			t.Fatalf("Resign after expiry: %v", err)
		}
		if rec, _, _ := f.Store.Get(t.Context(), "l"); rec.Holder != "" {
			t.Errorf("record after Resign = %+v, want released", rec)
		}
	})
}

// Close must not hang on, or leak, a campaign that wins while it closes.
func TestCloseDuringCampaign(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		a := newBackend(t, store, cfg)
		b, err := backend.NewRecordBackend(store, backend.RecordOptions{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		ta, err := a.Campaign(t.Context(), "l", baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := b.Campaign(t.Context(), "l", baton.Candidate{ID: "b"})
			errc <- err
		}()
		synctest.Wait() // b is waiting
		if err := b.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, baton.ErrClosed) {
			t.Errorf("waiting campaign after Close: err = %v, want ErrClosed", err)
		}
		_ = ta.Resign(t.Context())
	})
}

// A RecordBackend holding many leases keeps no goroutine per held lease:
// one renewer renews them all, and the end of a term is handled when it
// comes, not by a goroutine waiting for it.
func TestHeldLeasesNeedNoGoroutineEach(t *testing.T) {
	const n = 300
	b := newBackend(t, memory.NewStore(), backend.Config{TTL: 10 * time.Second})
	terms := make([]baton.Term, n)
	for i := range n {
		term, err := b.Campaign(t.Context(), fmt.Sprintf("many-%d", i), baton.Candidate{ID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		terms[i] = term
	}
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		t.Fatal(err)
	}
	// Each goroutine's stack, in the debug=2 form, is a paragraph.
	mine := 0
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "backend.(*RecordBackend)") {
			mine++
		}
	}
	if mine > 4 {
		t.Errorf("%d goroutines of the RecordBackend while it holds %d leases; want a few, not one per lease", mine, n)
	}
	for _, term := range terms {
		if err := term.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}
