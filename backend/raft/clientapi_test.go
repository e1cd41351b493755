package raft

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// post sends body to path on h, with the Authorization header auth (none
// when empty), and returns the status and body.
func post(t *testing.T, h http.Handler, path, auth string, body any, header ...string) (int, string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", path, bytes.NewReader(b))
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, strings.TrimSpace(w.Body.String())
}

// An agent client's session can be acted on only by the client that
// created it, and only through the client API: not by another local
// process that read its ID from the lease table (with or without the
// agent's token), not by a raw log command, and not by a member through
// the group API, whatever it forwards.
func TestClientSessionOnlyItsOwner(t *testing.T) {
	// Sessions of an hour, so that only the log refuses what is refused.
	g := newTestGroup(t, 3, func(o *NodeOptions) { o.MaxTTL = 2 * time.Hour })
	leader := g.leader()
	var follower *Node
	for _, n := range g.members() {
		if n != leader {
			follower = n
			break
		}
	}
	cfg := backend.Config{TTL: 5 * time.Second}
	for _, via := range []*Node{leader, follower} {
		name := "leader"
		if via == follower {
			name = "follower"
		}
		t.Run("agent on the "+name, func(t *testing.T) {
			c, err := Dial(serveClients(t, via), ClientOptions{Token: testClientToken, PlainTCP: true})
			if err != nil {
				t.Fatal(err)
			}
			lease := "owned-" + name
			term := testkit.CampaignWithin(t, newBackend(t, c, cfg), lease, "holder", 20*time.Second)
			v, _ := leader.fsm.lease(lease, "")
			sid := v.Session
			if sid == "" || v.Token != term.Token() {
				t.Fatalf("lease %+v, want the holder's", v)
			}
			clients, err := via.ClientHandler(testClientToken)
			if err != nil {
				t.Fatal(err)
			}
			bearer := "Bearer " + testClientToken
			guess := strings.Repeat("0", 64)
			for _, a := range []struct {
				what, path, auth string
				body             any
				want             int
			}{
				{"raw session-expire on the member route", "/v1/raft/apply", "", command{Op: opSessionExpire, Session: sid}, http.StatusNotFound},
				{"raw session-expire with the token", "/v1/raft/apply", bearer, command{Op: opSessionExpire, Session: sid}, http.StatusNotFound},
				{"raw renew with the token", "/v1/raft/renew", bearer, renewRequest{Session: sid}, http.StatusNotFound},
				{"client API without the token", "/v1/raft/client/apply", "", clientRequest{Op: opSessionDestroy, Session: sid, Secret: guess}, http.StatusUnauthorized},
				{"client API with a wrong token", "/v1/raft/client/apply", "Bearer not-the-token", clientRequest{Op: opSessionDestroy, Session: sid, Secret: guess}, http.StatusUnauthorized},
				{"session-expire through the client API", "/v1/raft/client/apply", bearer, clientRequest{Op: opSessionExpire, Session: sid, Secret: guess}, http.StatusForbidden},
				{"request-resign through the client API", "/v1/raft/client/apply", bearer, clientRequest{Op: opRequestResign, Session: sid, Secret: guess, Lease: lease}, http.StatusForbidden},
				{"destroy without the secret", "/v1/raft/client/apply", bearer, clientRequest{Op: opSessionDestroy, Session: sid}, http.StatusForbidden},
				{"destroy with a guessed secret", "/v1/raft/client/apply", bearer, clientRequest{Op: opSessionDestroy, Session: sid, Secret: guess}, http.StatusForbidden},
				{"release with a guessed secret", "/v1/raft/client/apply", bearer, clientRequest{Op: opRelease, Session: sid, Secret: guess, Lease: lease, Token: term.Token()}, http.StatusForbidden},
				{"state with a guessed secret", "/v1/raft/client/apply", bearer, clientRequest{Op: opStateStore, Session: sid, Secret: guess, Lease: lease, Token: term.Token(), Value: []byte("x")}, http.StatusForbidden},
				{"re-create with another secret", "/v1/raft/client/apply", bearer, clientRequest{Op: opSessionCreate, Session: sid, Secret: guess, TTL: time.Hour}, http.StatusOK},
				{"renew with a guessed secret", "/v1/raft/client/renew", bearer, renewRequest{Session: sid, Secret: guess}, http.StatusForbidden},
				{"a forwarded-looking call", "/v1/raft/client/apply", bearer, clientRequest{Op: opSessionDestroy, Session: sid, Secret: guess}, http.StatusForbidden},
			} {
				var header []string
				if a.what == "a forwarded-looking call" {
					header = []string{forwardedHeader, "1"}
				}
				code, body := post(t, clients, a.path, a.auth, a.body, header...)
				if code != a.want {
					t.Errorf("%s: %d %s, want %d", a.what, code, body, a.want)
				}
				if a.what == "re-create with another secret" && !strings.Contains(body, errSessionExists) {
					t.Errorf("%s: %s, want the log's refusal %q", a.what, body, errSessionExists)
				}
			}

			// Members call each other with the group's secret; none may
			// send the raft leader's own commands, or act on a client's
			// session without its secret, even as a forwarded call.
			members := leader.handler()
			secret := "Bearer " + g.secret
			for _, a := range []struct {
				what, path string
				body       any
			}{
				{"session-expire", "/v1/raft/apply", command{Op: opSessionExpire, Session: sid}},
				{"noop", "/v1/raft/apply", command{Op: opNoop}},
				{"destroy a client's session", "/v1/raft/apply", command{Op: opSessionDestroy, Session: sid}},
				{"release a client's lease", "/v1/raft/apply", command{Op: opRelease, Session: sid, Lease: lease, Token: term.Token()}},
				{"create an agent session", "/v1/raft/apply", command{Op: opSessionCreate, Session: "s-mine", Agent: true, TTL: time.Hour}},
				{"renew a client's session", "/v1/raft/renew", renewRequest{Session: sid}},
				{"forward a client's destroy without the secret", "/v1/raft/client/apply", clientRequest{Op: opSessionDestroy, Session: sid, Secret: guess}},
				{"forward a client's renew without the secret", "/v1/raft/client/renew", renewRequest{Session: sid, Secret: guess}},
			} {
				if code, body := post(t, members, a.path, secret, a.body, forwardedHeader, "1"); code != http.StatusForbidden {
					t.Errorf("member API, %s: %d %s, want 403", a.what, code, body)
				}
			}

			v, _ = leader.fsm.lease(lease, sid)
			if v.SessionGone || v.Session != sid || v.Token != term.Token() || term.Err() != nil {
				t.Fatalf("after the attacks: %+v, term err %v; want the holder's session and term untouched", v, term.Err())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := term.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if v, _ := leader.fsm.lease(lease, sid); v.Session != "" {
				t.Fatalf("the holder's own release did not release: %+v", v)
			}
		})
	}
}
