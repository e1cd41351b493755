package baton_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
)

var testCfg = backend.Config{TTL: 3 * time.Second}

func newElector(t *testing.T, store *memory.Store, id string) (*baton.Elector, *memory.Backend) {
	t.Helper()
	b, err := memory.New(store, memory.Options{Config: testCfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "job", Candidate: baton.Candidate{ID: id}})
	if err != nil {
		t.Fatal(err)
	}
	return e, b
}

func TestRunWaitsForCallbackBeforeResigning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		a, _ := newElector(t, store, "a")
		b, _ := newElector(t, store, "b")
		ctx, cancel := context.WithCancel(t.Context())
		aReturned := make(chan time.Time, 1)
		aLeads := make(chan struct{})
		go func() {
			_ = a.Run(ctx, func(fctx context.Context, _ baton.Term) error {
				close(aLeads)
				<-fctx.Done()
				time.Sleep(time.Second) // slow clean-up, ignoring the cancel
				aReturned <- time.Now()
				return nil
			})
		}()
		<-aLeads
		bLed := make(chan time.Time, 1)
		bctx, bcancel := context.WithCancel(t.Context())
		go func() {
			_ = b.Run(bctx, func(context.Context, baton.Term) error {
				bLed <- time.Now()
				bcancel()
				return nil
			})
		}()
		cancel()
		returned, led := <-aReturned, <-bLed
		if led.Before(returned) {
			t.Errorf("b led at %v, before a's callback returned at %v", led, returned)
		}
		if led.Sub(returned) >= testCfg.TTL {
			t.Errorf("b took over %s after a returned; Run must resign, not let the lease expire", led.Sub(returned))
		}
	})
}

func TestCallbackCancelledAtSafeUntilWhenCutOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		e, b := newElector(t, store, "a")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var safeUntil time.Time
		got := make(chan error, 1)
		go func() {
			got <- e.Run(ctx, func(fctx context.Context, term baton.Term) error {
				b.Disconnect()
				<-fctx.Done()
				safeUntil = term.SafeUntil()
				if late := time.Since(safeUntil); late > 0 {
					t.Errorf("callback cancelled %s after safe-until", late)
				}
				<-term.Done() // the Elector's and the term's timers fire at the same instant
				if !errors.Is(term.Err(), baton.ErrExpired) {
					t.Errorf("term.Err() = %v, want ErrExpired", term.Err())
				}
				return errors.New("stop")
			})
		}()
		if err := <-got; err == nil || err.Error() != "stop" {
			t.Fatalf("Run returned %v, want the callback's error", err)
		}
		if e.Status().Leader {
			t.Errorf("IsLeader after the term expired")
		}
	})
}

// The hooks carry each transition's token and reason, and agree with
// Status.
func TestHooksCarryReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := memory.New(memory.NewStore(), memory.Options{Config: testCfg})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(context.Background())
		var up, down []uint64
		var reason error
		e, err := baton.NewElector(b, baton.ElectorConfig{
			Lease:     "job",
			Candidate: baton.Candidate{ID: "a"},
			OnElected: func(t baton.Term) { up = append(up, t.Token()) },
			OnDemoted: func(t baton.Term, r error) { down, reason = append(down, t.Token()), r },
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Run(t.Context(), func(context.Context, baton.Term) error { return errors.New("done") }); err == nil || err.Error() != "done" {
			t.Fatalf("Run = %v, want the callback's error", err)
		}
		if fmt.Sprint(up, down) != "[1] [1]" {
			t.Errorf("elected %v, demoted %v; want token 1 once each", up, down)
		}
		if !errors.Is(reason, baton.ErrResigned) {
			t.Errorf("OnDemoted reason = %v, want ErrResigned", reason)
		}
		if st := e.Status(); st.Leader || st.Token != 1 || st.LastError != reason {
			t.Errorf("Status = %+v after the term; want not leader, token 1, LastError the demotion's reason", st)
		}
	})
}

func TestAwaitStatusIsLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := newElector(t, memory.NewStore(), "a")
		if e.Status().Leader {
			t.Fatal("IsLeader before Run")
		}
		ctx, cancel := context.WithCancel(t.Context())
		release := make(chan struct{})
		done := make(chan error)
		go func() {
			done <- e.Run(ctx, func(fctx context.Context, _ baton.Term) error {
				<-release
				return nil
			})
		}()
		term, err := e.Await(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		st := e.Status()
		if !st.Leader || st.Term != term || st.Token != term.Token() || st.Terms != 1 || st.ID != "a" || st.Lease != "job" {
			t.Errorf("Status = %+v while leading with token %d", st, term.Token())
		}
		rec, err := e.Leader(t.Context())
		if err != nil || rec.Holder != "a" {
			t.Errorf("Leader = %+v, %v", rec, err)
		}
		if err := e.Run(ctx, nil); err == nil {
			t.Errorf("a second concurrent Run was accepted")
		}
		cancel()
		close(release)
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
		if st := e.Status(); st.Leader || st.Term != nil {
			t.Errorf("still leader after Run returned")
		}
	})
}

func TestRunRetriesUnavailableBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, b := newElector(t, memory.NewStore(), "a")
		b.Disconnect()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error)
		go func() { done <- e.Run(ctx, func(context.Context, baton.Term) error { return errors.New("led") }) }()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if err := e.Status().LastError; !errors.Is(err, baton.ErrBackendUnavailable) {
			t.Errorf("Status().LastError = %v, want ErrBackendUnavailable", err)
		}
		b.Reconnect()
		if err := <-done; err == nil || err.Error() != "led" {
			t.Errorf("Run = %v; want it to lead once the backend is back", err)
		}
	})
}

func TestNewElectorReportsEveryProblem(t *testing.T) {
	_, err := baton.NewElector(nil, baton.ElectorConfig{RetryMin: -1})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("err = %v; want a ConfigError with 3 problems", err)
	}
	for _, want := range []string{"Backend is nil", "Lease is empty", "must not be negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestCandidateID(t *testing.T) {
	a, b := baton.NewCandidateID(), baton.NewCandidateID()
	if a == b {
		t.Errorf("two candidate IDs are equal: %s", a)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "baton"
	}
	for _, id := range []string{a, b} {
		h, suffix, _ := strings.Cut(id, "/")
		if _, err := hex.DecodeString(suffix); h != host || len(suffix) != 8 || err != nil {
			t.Errorf("NewCandidateID() = %q, want %q + \"/\" + 8 hexadecimal digits", id, host)
		}
	}
}

func TestStopEarlyCancelsBeforeSafeUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b, err := memory.New(store, memory.Options{Config: testCfg})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(context.Background())
		const early = 500 * time.Millisecond
		e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "job", StopEarly: early})
		if err != nil {
			t.Fatal(err)
		}
		err = e.Run(t.Context(), func(ctx context.Context, term baton.Term) error {
			// Healthy renewals never trigger StopEarly.
			time.Sleep(3 * testCfg.TTL)
			if ctx.Err() != nil {
				t.Fatalf("callback cancelled while renewals were healthy")
			}
			b.Disconnect()
			<-ctx.Done()
			if left := time.Until(term.SafeUntil()); left < early {
				t.Errorf("cancelled %s before safe-until, want at least %s", left, early)
			}
			if term.Err() != nil {
				t.Errorf("term already ended (%v): the cancel came at safe-until, not before", term.Err())
			}
			if cause := context.Cause(ctx); !errors.Is(cause, baton.ErrStoppedEarly) || !strings.Contains(cause.Error(), "renewals lag") {
				t.Errorf("context.Cause = %v, want ErrStoppedEarly naming the lagging renewals", cause)
			}
			return errors.New("stopped")
		})
		if err == nil || err.Error() != "stopped" {
			t.Fatalf("Run = %v", err)
		}
	})
}

// TestHooksSeeEveryTransition: OnElected runs before the callback gets the
// term, OnDemoted after the release, with the term's end reason;
// a term lost to an operator (here: another process taking the record over
// after this one stopped renewing is simulated by Close) reports it.
func TestHooksSeeEveryTransition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := memory.New(memory.NewStore(), memory.Options{Config: testCfg})
		if err != nil {
			t.Fatal(err)
		}
		var events []string
		e, err := baton.NewElector(b, baton.ElectorConfig{
			Lease:     "job",
			Candidate: baton.Candidate{ID: "a"},
			OnElected: func(t baton.Term) { events = append(events, fmt.Sprintf("elected %d", t.Token())) },
			OnDemoted: func(t baton.Term, reason error) {
				events = append(events, fmt.Sprintf("demoted %d resigned=%v closed=%v", t.Token(),
					errors.Is(reason, baton.ErrResigned), errors.Is(reason, baton.ErrClosed)))
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		runs := 0
		done := make(chan error)
		go func() {
			done <- e.Run(ctx, func(ctx context.Context, term baton.Term) error {
				runs++
				events = append(events, fmt.Sprintf("callback %d", term.Token()))
				if runs == 1 {
					return nil // resign; campaign again
				}
				_ = b.Close(context.Background()) // the backend goes away under the term
				<-ctx.Done()
				return nil
			})
		}()
		<-done
		want := []string{
			"elected 1", "callback 1", "demoted 1 resigned=true closed=false",
			"elected 2", "callback 2", "demoted 2 resigned=false closed=true",
		}
		if fmt.Sprint(events) != fmt.Sprint(want) {
			t.Errorf("events = %q\nwant     %q", events, want)
		}
	})
}

// requestBackend hands out BasicTerms, as a backend that relays resign
// requests does, and records when each is released. A second Campaign
// waits for its context.
type requestBackend struct {
	terms    chan *backend.BasicTerm
	released chan time.Time
	calls    int
}

func (b *requestBackend) Campaign(ctx context.Context, name string, _ baton.Candidate) (baton.Term, error) {
	b.calls++
	if b.calls > 1 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	t := backend.NewBasicTerm(name, 7, time.Now().Add(time.Hour), func(context.Context) error {
		b.released <- time.Now()
		return nil
	})
	b.terms <- t
	return t, nil
}

func (b *requestBackend) Leader(context.Context, string) (baton.Record, error) {
	return baton.Record{}, baton.ErrNoLeader
}

// A resign requested from outside cancels the callback and releases the
// lease only once the callback has returned: the term goes on (and would
// be renewed) while the work winds down.
func TestRequestedResignReleasesAfterCallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &requestBackend{terms: make(chan *backend.BasicTerm, 1), released: make(chan time.Time, 1)}
		e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "job", Candidate: baton.Candidate{ID: "a"}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		returned := make(chan time.Time, 1)
		var cause error
		go func() {
			_ = e.Run(ctx, func(fctx context.Context, term baton.Term) error {
				<-fctx.Done()
				cause = context.Cause(fctx)
				if term.Err() != nil {
					t.Errorf("the term ended (%v) before the callback returned", term.Err())
				}
				time.Sleep(time.Second) // winding down, as a child in its grace period
				returned <- time.Now()
				return nil
			})
		}()
		term := <-b.terms
		synctest.Wait()
		if !term.RequestResign(fmt.Errorf("%w: asked by the test", baton.ErrResigned)) {
			t.Fatal("RequestResign of a live term reported no request")
		}
		ret := <-returned
		rel := <-b.released
		if rel.Before(ret) {
			t.Errorf("released at %v, before the callback returned at %v", rel, ret)
		}
		if !errors.Is(cause, baton.ErrResigned) || !strings.Contains(cause.Error(), "resign was requested") {
			t.Errorf("callback's cause = %v, want ErrResigned saying a resign was requested", cause)
		}
		<-term.Done()
		if err := term.Err(); !errors.Is(err, baton.ErrResigned) || !strings.Contains(err.Error(), "asked by the test") {
			t.Errorf("term.Err() = %v, want the request's reason", err)
		}
	})
}

// shortBackend wins every campaign at once, with a term whose safe-until
// is already within the Elector's StopEarly: a session that lags but
// still hands out terms. After max campaigns it waits for the context.
type shortBackend struct {
	left      time.Duration
	max       int
	campaigns int
}

func (b *shortBackend) Campaign(ctx context.Context, name string, _ baton.Candidate) (baton.Term, error) {
	b.campaigns++
	if b.campaigns > b.max {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return backend.NewBasicTerm(name, uint64(b.campaigns), time.Now().Add(b.left), nil), nil
}

func (b *shortBackend) Leader(context.Context, string) (baton.Record, error) {
	return baton.Record{}, baton.ErrNoLeader
}

// An Elector that wins only terms too short for its StopEarly resigns each
// without running the work, and campaigns again after a back-off, as after
// a failed campaign: not at once, which would take a term (and a fencing
// token) per round trip for as long as the backend lags.
func TestRunBacksOffAfterTooShortTerms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &shortBackend{left: 50 * time.Millisecond, max: 100}
		e, err := baton.NewElector(b, baton.ElectorConfig{
			Lease: "job", Candidate: baton.Candidate{ID: "a"},
			StopEarly: 100 * time.Millisecond, RetryMin: 100 * time.Millisecond, RetryMax: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		ran := false
		err = e.Run(ctx, func(context.Context, baton.Term) error { ran = true; return nil })
		if !errors.Is(err, context.DeadlineExceeded) || ran {
			t.Fatalf("Run = %v, work ran %v; want the deadline, no work", err, ran)
		}
		// Waits of at least 50, 100, 200, 400, 500 and 500 ms: no more
		// than seven campaigns fit in 2 s.
		if b.campaigns > 7 {
			t.Fatalf("%d campaigns in 2 s, each winning a term too short to lead; want a back-off between them", b.campaigns)
		}
	})
}
