// Package testkit holds the helpers that baton's tests share: polling for a
// condition, a context bounded by the test, campaigning on any
// baton.Backend in the foreground or in the background, and serving an
// HTTP handler on loopback.
//
// It is for tests only (it imports testing); every module of the
// repository may import it, since they all live under the
// github.com/batonhq/baton path.
//
// The bounds the helpers take keep a failing test from hanging; they are
// not assertions of speed. Measurements of how long something takes
// belong in bench, where the figures are reported.
//
// Eventually, EventuallyErr, Campaign, CampaignWithin, WaitTerm and
// WaitDone stop the test with t.Fatalf, and so must be called from the
// test's goroutine.
package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
)

// PollInterval is how often Eventually and EventuallyErr check their
// condition.
const PollInterval = 10 * time.Millisecond

// Eventually polls cond every PollInterval until it holds, and fails the
// test with "timed out after TIMEOUT waiting for WHAT" once timeout has
// passed without it holding. cond is first called at once.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, PollInterval, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Poll polls cond every interval until it holds, and reports whether it
// did before timeout passed. cond is first called at once. It is
// Eventually for tests that report a failure their own way, or whose
// condition is too costly to check every PollInterval.
func Poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// EventuallyErr polls f every PollInterval until it returns nil, and fails
// the test with f's last error once timeout has passed. It is Eventually
// for conditions whose failure has a reason worth reporting.
func EventuallyErr(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		<-tick.C
	}
}

// Context returns a context that ends after d, or when the test's own
// context (t.Context) ends, whichever is first. Like t.Context, it is
// cancelled before the test's Cleanup functions run: a clean-up that
// needs a context must make its own.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// Unique returns prefix with a random suffix: a name that no other test,
// nor another run of the same one (-count) on a shared server, uses.
func Unique(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// CampaignTimeout bounds the campaign of Campaign.
const CampaignTimeout = 30 * time.Second

// Campaign campaigns on b for lease as candidate id and returns the term,
// failing the test if the campaign fails or has not won within
// CampaignTimeout.
func Campaign(t testing.TB, b baton.Backend, lease, id string) baton.Term {
	t.Helper()
	return CampaignWithin(t, b, lease, id, CampaignTimeout)
}

// CampaignWithin is Campaign with the campaign bounded by d instead of
// CampaignTimeout.
func CampaignWithin(t testing.TB, b baton.Backend, lease, id string, d time.Duration) baton.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	term, err := b.Campaign(ctx, lease, baton.Candidate{ID: id})
	if err != nil {
		t.Fatalf("%s campaigning for %s: %v", id, lease, err)
	}
	return term
}

// CampaignBurst starts n campaigns at once on b, for leases prefix-0000
// to prefix-(n-1), as candidate id, and waits for all of them: a process
// starting with many leases. It fails the test, naming the first error,
// if any campaign fails within d.
func CampaignBurst(t testing.TB, b baton.Backend, prefix, id string, n int, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := b.Campaign(ctx, fmt.Sprintf("%s-%04d", prefix, i), baton.Candidate{ID: id})
			errs <- err
		}()
	}
	var failed []error
	for range n {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d campaigns started at once failed; the first: %v", len(failed), n, failed[0])
	}
}

// StateTerm returns term as a baton.StateTerm, failing the test if it
// does not implement it.
func StateTerm(t testing.TB, term baton.Term) baton.StateTerm {
	t.Helper()
	st, ok := term.(baton.StateTerm)
	if !ok {
		t.Fatalf("term %T does not implement baton.StateTerm", term)
	}
	return st
}

// Won is what a background campaign (CampaignAsync) delivers: the term
// and when the campaign returned it, or a nil Term after a failure that
// was reported on the test.
type Won struct {
	Term baton.Term
	At   time.Time
}

// CampaignAsync campaigns on b for lease as candidate id in the
// background, and delivers the outcome on the channel (buffered: it never
// blocks the campaign). The campaign waits as long as the test runs: bound
// the wait for it with WaitTerm. A campaign that fails is reported with
// t.Errorf and delivers a nil Term. A campaign still waiting when the test
// ends is cancelled quietly, and the test waits for it to return before
// running the Cleanup functions registered before CampaignAsync (such as
// closing b).
func CampaignAsync(t testing.TB, b baton.Backend, lease, id string) <-chan Won {
	got := make(chan Won, 1)
	ctx := t.Context() // cancelled as the test ends, before its clean-ups
	returned := make(chan struct{})
	t.Cleanup(func() { <-returned })
	go func() {
		defer close(returned)
		term, err := b.Campaign(ctx, lease, baton.Candidate{ID: id})
		if err != nil && ctx.Err() == nil {
			t.Errorf("%s campaigning for %s: %v", id, lease, err)
		}
		got <- Won{Term: term, At: time.Now()}
	}()
	return got
}

// WaitTerm waits up to d for a background campaign's outcome and returns
// it. It fails the test if none comes within d, or if the campaign failed
// (CampaignAsync reported why).
func WaitTerm(t testing.TB, got <-chan Won, d time.Duration) Won {
	t.Helper()
	select {
	case w := <-got:
		if w.Term == nil {
			t.Fatalf("the campaign failed (reported above)")
		}
		return w
	case <-time.After(d):
		t.Fatalf("no term within %s", d)
		return Won{}
	}
}

// WaitDone waits up to d for term to end, and returns when it saw it end.
// It fails the test if term has not ended within d.
func WaitDone(t testing.TB, term baton.Term, d time.Duration) time.Time {
	t.Helper()
	select {
	case <-term.Done():
		return time.Now()
	case <-time.After(d):
		t.Fatalf("term %d of %s did not end within %s", term.Token(), term.Lease(), d)
		return time.Time{}
	}
}

// Closer is a backend, or anything else, that closes with a context.
type Closer interface {
	Close(ctx context.Context) error
}

// CloseAtEnd closes c when the test ends, giving Close up to d, and
// returns c. Close's error is ignored: a test that kills a process on
// purpose leaves a backend whose Close cannot succeed. A test that checks
// Close calls it itself. Cleanups run last-in first-out, so c is closed
// before whatever was registered earlier (the client it runs on).
func CloseAtEnd[C Closer](t testing.TB, c C, d time.Duration) C {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// ServeHTTP serves h on a port of its own on 127.0.0.1 and returns the
// address. When the test ends the server shuts down, giving requests in
// flight up to a second, and then closes whatever connections remain (a
// long poll, say).
func ServeHTTP(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
	})
	return ln.Addr().String()
}

// WriteHeapProfile writes the heap profile to path: what a benchmark holds
// at a moment it chooses, where -memprofile shows the heap at its end.
func WriteHeapProfile(tb testing.TB, path string) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}

// CPUTime is the CPU time the process has used, user and system.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
