package testkit_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/internal/testkit"
)

// recorder is a testing.TB whose Fatalf records the message and ends the
// calling goroutine, as the real one does, without failing the test.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatal runs f with a recorder in a goroutine of its own and returns the
// message f's Fatalf call recorded, or "" if f returned.
func fatal(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.msg
}

func TestEventually(t *testing.T) {
	var n atomic.Int32
	testkit.Eventually(t, 5*time.Second, "three calls", func() bool { return n.Add(1) == 3 })
	if got := n.Load(); got != 3 {
		t.Fatalf("cond called %d times, want 3", got)
	}
	msg := fatal(t, func(tb testing.TB) {
		testkit.Eventually(tb, 50*time.Millisecond, "the impossible", func() bool { return false })
	})
	if want := "timed out after 50ms waiting for the impossible"; msg != want {
		t.Fatalf("Fatalf(%q), want %q", msg, want)
	}
}

func TestEventuallyErr(t *testing.T) {
	var n atomic.Int32
	testkit.EventuallyErr(t, 5*time.Second, "three calls", func() error {
		if n.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	msg := fatal(t, func(tb testing.TB) {
		testkit.EventuallyErr(tb, 50*time.Millisecond, "the impossible", func() error { return errors.New("last reason") })
	})
	if want := "timed out after 50ms waiting for the impossible: last reason"; msg != want {
		t.Fatalf("Fatalf(%q), want %q", msg, want)
	}
}

func TestContextEndsAfterItsBound(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Millisecond)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the context did not end")
	}
}

func newBackend(t *testing.T, s *memory.Store) *memory.Backend {
	b, err := memory.New(s, memory.Options{Config: backend.Config{TTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	return testkit.CloseAtEnd(t, b, 5*time.Second)
}

// A background campaign waits while the lease is held, wins once it is
// released, and delivers the term.
func TestCampaignAsyncWinsAfterRelease(t *testing.T) {
	s := memory.NewStore()
	a, b := newBackend(t, s), newBackend(t, s)
	first := testkit.Campaign(t, a, "job", "a")
	got := testkit.CampaignAsync(t, b, "job", "b")
	select {
	case w := <-got:
		t.Fatalf("b won %v while a held the lease", w.Term)
	default:
	}
	if err := first.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, first, 10*time.Second)
	w := testkit.WaitTerm(t, got, 10*time.Second)
	if w.Term.Token() <= first.Token() {
		t.Fatalf("b's token %d is not above a's %d", w.Term.Token(), first.Token())
	}
}

// A background campaign still waiting when the test ends is cancelled
// without failing the test, and has returned before the backend closes.
func TestCampaignAsyncCancelledQuietly(t *testing.T) {
	s := memory.NewStore()
	a := newBackend(t, s)
	testkit.Campaign(t, a, "job", "a")
	var got <-chan testkit.Won
	t.Run("waiter", func(t *testing.T) {
		b := newBackend(t, s)
		got = testkit.CampaignAsync(t, b, "job", "b")
	})
	select {
	case w := <-got:
		if w.Term != nil {
			t.Fatalf("the cancelled campaign won token %d", w.Term.Token())
		}
	default:
		t.Fatal("the subtest ended with its campaign still running")
	}
}

func TestWaitTermReportsNoTerm(t *testing.T) {
	got := make(chan testkit.Won)
	msg := fatal(t, func(tb testing.TB) { testkit.WaitTerm(tb, got, 20*time.Millisecond) })
	if !strings.Contains(msg, "no term within 20ms") {
		t.Fatalf("Fatalf(%q), want no term within 20ms", msg)
	}
}

func TestPoll(t *testing.T) {
	if testkit.Poll(30*time.Millisecond, time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll of a condition that never holds = true")
	}
	var n atomic.Int32
	if !testkit.Poll(5*time.Second, time.Millisecond, func() bool { return n.Add(1) == 2 }) {
		t.Fatal("Poll of a condition that holds at the second call = false")
	}
}

// ServeHTTP serves on loopback until the test ends, and a request still in
// flight then (a long poll) does not hold up the test's end.
func TestServeHTTP(t *testing.T) {
	polling := make(chan struct{})
	var addr string
	t.Run("serve", func(t *testing.T) {
		addr = testkit.ServeHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/poll" {
				close(polling)
				<-r.Context().Done()
				return
			}
			fmt.Fprint(w, "hello")
		}))
		if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
			t.Fatalf("ServeHTTP bound %s, want 127.0.0.1", addr)
		}
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello" {
			t.Fatalf("body %q, want hello", body)
		}
		go func() {
			if resp, err := http.Get("http://" + addr + "/poll"); err == nil {
				resp.Body.Close()
			}
		}()
		<-polling
	})
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatalf("%s still accepts connections after the test ended", addr)
	}
}

// CampaignWithin gives up after its own bound, failing the test with the
// campaign's error.
func TestCampaignWithinBound(t *testing.T) {
	s := memory.NewStore()
	a, b := newBackend(t, s), newBackend(t, s)
	testkit.Campaign(t, a, "job", "a")
	msg := fatal(t, func(tb testing.TB) { testkit.CampaignWithin(tb, b, "job", "b", 50*time.Millisecond) })
	if !strings.Contains(msg, "b campaigning for job") || !strings.Contains(msg, "deadline exceeded") {
		t.Fatalf("Fatalf(%q), want b's campaign for job failing at its deadline", msg)
	}
}

// StateTerm passes a term that keeps state through, and fails on one that
// does not.
func TestStateTerm(t *testing.T) {
	term := testkit.Campaign(t, newBackend(t, memory.NewStore()), "job", "a")
	if st := testkit.StateTerm(t, term); st == nil {
		t.Fatal("StateTerm of a memory term = nil")
	}
	msg := fatal(t, func(tb testing.TB) { testkit.StateTerm(tb, struct{ baton.Term }{term}) })
	if !strings.Contains(msg, "does not implement baton.StateTerm") {
		t.Fatalf("Fatalf(%q), want a term that does not implement baton.StateTerm", msg)
	}
}
