package health_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/health"
	"github.com/batonhq/baton/internal/testkit"
)

// got is one answer as a client sees it.
type got struct {
	code int
	body health.Answer
	raw  string
}

func check(t *testing.T, method, url string) got {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	g := got{code: resp.StatusCode, raw: string(raw)}
	if method == http.MethodGet {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", method, url, ct)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s %s: Cache-Control %q, want no-store: a cached answer is a stale one", method, url, cc)
		}
		var a struct {
			Status, Lease, Holder, Token, Member, Reason string
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, url, raw, err)
		}
		g.body = health.Answer{Status: health.Status(a.Status), Lease: a.Lease, Holder: a.Holder, Member: a.Member, Reason: a.Reason}
		if a.Token != "" {
			if _, err := json.Number(a.Token).Int64(); err != nil {
				t.Errorf("token %q is not a number in a string", a.Token)
			}
		}
	}
	return g
}

func newBackend(t *testing.T, s *memory.Store) *memory.Backend {
	t.Helper()
	b, err := memory.New(s, memory.Options{Config: backend.Config{TTL: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

// TestLeaderAnswers walks one Elector through the answers: nobody holds
// the lease (503), another holds it (429, naming it), this process leads
// (200, with its token), the backend cut off while not leading (503),
// and the backend naming this process while its Elector does not lead
// (503, never 200).
func TestLeaderAnswers(t *testing.T) {
	t.Parallel()
	store := memory.NewStore()
	mine := newBackend(t, store)
	e, err := baton.NewElector(mine, baton.ElectorConfig{Lease: "work", Candidate: baton.Candidate{ID: "me"}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := health.NewLeader(e, health.Options{ReadTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+health.Path, h)
	url := "http://" + testkit.ServeHTTP(t, mux) + health.Path

	// Nobody holds the lease.
	if g := check(t, "GET", url); g.code != http.StatusServiceUnavailable || g.body.Status != health.Undetermined || !strings.Contains(g.body.Reason, "nobody holds") {
		t.Errorf("free lease: %d %s", g.code, g.raw)
	}

	// Another candidate holds it: standby, naming it.
	other := newBackend(t, store)
	ot := testkit.Campaign(t, other, "work", "other")
	if g := check(t, "GET", url); g.code != http.StatusTooManyRequests || g.body.Status != health.Standby || g.body.Holder != "other" ||
		!strings.Contains(g.raw, `"token": "1"`) {
		t.Errorf("another holds the lease: %d %s", g.code, g.raw)
	}
	if g := check(t, "HEAD", url); g.code != http.StatusTooManyRequests || g.raw != "" {
		t.Errorf("HEAD: %d %q", g.code, g.raw)
	}
	// ?standbyok=true: a standby is healthy, 200, its body still standby.
	if g := check(t, "GET", url+"?standbyok=true"); g.code != http.StatusOK || g.body.Status != health.Standby || g.body.Holder != "other" {
		t.Errorf("standby, ?standbyok=true: %d %s", g.code, g.raw)
	}
	if g := check(t, "GET", url+"?standbyok=false"); g.code != http.StatusTooManyRequests {
		t.Errorf("standby, ?standbyok=false: %d %s", g.code, g.raw)
	}

	// This process leads.
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() {
		ran <- e.Run(ctx, func(ctx context.Context, _ baton.Term) error { <-ctx.Done(); return nil })
	}()
	if err := ot.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	term, err := e.Await(testkit.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g := check(t, "GET", url)
	if g.code != http.StatusOK || g.body.Status != health.Leader || g.body.Holder != "me" || g.body.Lease != "work" ||
		!strings.Contains(g.raw, `"token": "`+itoa(term.Token())+`"`) {
		t.Errorf("leading with token %d: %d %s", term.Token(), g.code, g.raw)
	}
	if g := check(t, "GET", url+"?standbyok=true"); g.code != http.StatusOK || g.body.Status != health.Leader {
		t.Errorf("leading, ?standbyok=true: %d %s", g.code, g.raw)
	}
	// Leading, it answers without the backend.
	mine.Disconnect()
	if g := check(t, "GET", url); g.code != http.StatusOK {
		t.Errorf("leading, backend cut off: %d %s", g.code, g.raw)
	}
	mine.Reconnect()
	cancel()
	if err := <-ran; err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}

	// Not leading, the backend cut off: undetermined, with ?standbyok too.
	mine.Disconnect()
	if g := check(t, "GET", url); g.code != http.StatusServiceUnavailable || !strings.Contains(g.body.Reason, "reading lease") {
		t.Errorf("backend cut off: %d %s", g.code, g.raw)
	}
	if g := check(t, "GET", url+"?standbyok=true"); g.code != http.StatusServiceUnavailable {
		t.Errorf("backend cut off, ?standbyok=true: %d %s", g.code, g.raw)
	}
	mine.Reconnect()

	// The backend names this process's ID, but its Elector does not lead.
	stale := testkit.Campaign(t, other, "work", "me")
	if g := check(t, "GET", url); g.code != http.StatusServiceUnavailable || g.body.Status != health.Undetermined {
		t.Errorf("backend names this process, Elector not leading: %d %s", g.code, g.raw)
	}
	_ = stale.Resign(testkit.Context(t, 5*time.Second))
}

func itoa(u uint64) string {
	b, _ := json.Marshal(u)
	return string(b)
}

// TestLeaderRequests: a request for another lease is undetermined and
// lists the Elector's lease; a ?standbyok that is not a boolean gets 400;
// methods other than GET and HEAD get 405.
func TestLeaderRequests(t *testing.T) {
	t.Parallel()
	e, err := baton.NewElector(newBackend(t, memory.NewStore()), baton.ElectorConfig{Lease: "work", Candidate: baton.Candidate{ID: "me"}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := health.NewLeader(e, health.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + testkit.ServeHTTP(t, h)
	if g := check(t, "GET", base+health.Path+"?lease=other"); g.code != http.StatusServiceUnavailable || !strings.Contains(g.raw, `"work"`) {
		t.Errorf("?lease=other: %d %s", g.code, g.raw)
	}
	req, err := http.NewRequestWithContext(t.Context(), "GET", base+health.Path+"?standbyok=maybe", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "standbyok") {
		t.Errorf("?standbyok=maybe: %d %s", resp.StatusCode, raw)
	}
	if g := check(t, "POST", base+health.Path); g.code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d %s", g.code, g.raw)
	}
}

// TestOptions: bad options and a nil Elector are refused with a message
// that says what to do.
func TestOptions(t *testing.T) {
	e, err := baton.NewElector(newBackend(t, memory.NewStore()), baton.ElectorConfig{Lease: "work"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := health.NewLeader(e, health.Options{ReadTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "ReadTimeout") {
		t.Errorf("negative ReadTimeout: %v", err)
	}
	if _, err := health.NewLeader(nil, health.Options{}); err == nil {
		t.Error("nil Elector accepted")
	}
	if _, err := health.NewHandler(nil, health.Options{}); err == nil {
		t.Error("nil Checker accepted")
	}
}

// TestAnswerCode maps each answer to its status code.
func TestAnswerCode(t *testing.T) {
	for _, tc := range []struct {
		a    health.Answer
		want int
	}{
		{health.Answer{Status: health.Leader}, 200},
		{health.Answer{Status: health.Standby}, 429},
		{health.Answer{Status: health.Undetermined}, 503},
		{health.Answer{Status: health.Undetermined, NameLease: true}, 400},
	} {
		if got := tc.a.Code(); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc.a, got, tc.want)
		}
	}
}
