package raft

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/agentsock"
	"github.com/batonhq/baton/internal/testkit"
)

// An agent whose renewals answer a ten-hour TTL (a server that lies, or an
// impostor) cannot stretch a client's term: every safe-until stays within
// the renewal's send time + the client's own TTL. The agent is reached on
// its Unix socket, proved by agentsock; it forwards every call to a real
// member and rewrites only the TTL of the renewals' replies.
func TestClientBelievesNoTTLFromTheAgent(t *testing.T) {
	g := newTestGroup(t, 1)
	// The group's member, joined but perhaps not yet its ready raft
	// leader (g.leader would then be nil): its handler answers "not the
	// leader" until it is, and the Client retries.
	real, err := g.members()[0].ClientHandler(testClientToken)
	if err != nil {
		t.Fatal(err)
	}
	lied := make(chan struct{}, 1)
	liar := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		real.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if r.URL.Path == "/v1/raft/client/renew" && rec.Code == http.StatusOK {
			body = []byte(`{"ttl": 36000000000000}`)
			select {
			case lied <- struct{}{}:
			default:
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	})
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := agentsock.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: liar, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	c, err := Dial(sock, ClientOptions{Token: testClientToken})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	b := newBackend(t, c, backend.Config{TTL: ttl})
	term := testkit.CampaignWithin(t, b, "liar", "holder", 20*time.Second)
	for range 3 {
		select {
		case <-lied:
		case <-term.Done():
			t.Fatalf("term ended: %v", term.Err())
		case <-time.After(30 * time.Second):
			t.Fatal("no renewal reached the agent")
		}
		// The renewal that got the lie was sent before now.
		if limit := time.Now().Add(ttl); term.SafeUntil().After(limit) {
			t.Fatalf("safe-until is %s ahead after the agent answered a ten-hour TTL; want at most the client's TTL, %s",
				time.Until(term.SafeUntil()).Round(time.Millisecond), ttl)
		}
	}
}

// A Client of an agent at HOST:PORT sends no credential: nothing proves
// that whatever answers there is the agent.
func TestClientSendsNoCredentialOverTCP(t *testing.T) {
	got := make(chan *http.Request, 16)
	addr := testkit.ServeHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		r.Body = nil
		r.Header.Set("X-Body", b.String())
		got <- r
		_, _ = w.Write([]byte(`{"ttl": 36000000000000}`))
	}))
	c, err := Dial(addr, ClientOptions{Token: testClientToken})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, c, backend.Config{TTL: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.Campaign(ctx, "x", baton.Candidate{ID: "c"}); !errors.Is(err, ErrUnprovenAgent) {
		t.Errorf("Campaign over TCP: %v, want ErrUnprovenAgent", err)
	}
	for {
		select {
		case r := <-got:
			if r.Header.Get("Authorization") != "" || bytes.Contains([]byte(r.Header.Get("X-Body")), []byte(`"secret"`)) {
				t.Errorf("%s %s over TCP carried a credential", r.Method, r.URL)
			}
		default:
			return
		}
	}
}
