package raft

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// checkLeaders asks b.Leaders for names and checks the answers against
// held (index to holder ID; every other name is held by nobody).
func checkLeaders(t *testing.T, b *Backend, names []string, held map[int]string) {
	t.Helper()
	recs, errs := b.Leaders(testkit.Context(t, 30*time.Second), names)
	for i, name := range names {
		want, isHeld := held[i]
		switch {
		case !isHeld && !errors.Is(errs[i], baton.ErrNoLeader):
			t.Errorf("Leaders of %s, held by nobody: %+v, %v; want ErrNoLeader", name, recs[i], errs[i])
		case isHeld && (errs[i] != nil || recs[i].Holder != want || recs[i].Lease != name):
			t.Errorf("Leaders of %s, held by %s: %+v, %v", name, want, recs[i], errs[i])
		}
	}
}

// Leaders on a member answers a list longer than one read call takes
// (1,024 names), linearizable and stale; a read call asking for more is
// refused with a clear error; through a member or agent that does not serve
// the read call (an earlier version: 404, or 403 on an agent's TCP
// address) Leaders is still answered, one read per lease.
func TestLeadersMany(t *testing.T) {
	g := newTestGroup(t, 3)
	n := readyLeaderOf(t, g)
	cfg := backend.Config{TTL: 3 * time.Second}
	b := newBackend(t, n, cfg)
	names := make([]string, maxReadMany+100)
	for i := range names {
		names[i] = fmt.Sprintf("many-%d", i)
	}
	held := map[int]string{}
	for _, i := range []int{0, maxReadMany - 1, maxReadMany, len(names) - 1} {
		held[i] = fmt.Sprintf("holder-%d", i)
		testkit.CampaignWithin(t, b, names[i], held[i], 10*time.Second)
	}
	checkLeaders(t, b, names, held)
	stale, err := New(n, Options{Config: cfg, StaleReads: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CloseAtEnd(t, stale, 3*time.Second)
	checkLeaders(t, stale, names, held)

	h, err := n.ClientHandler(testClientToken)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := Dial(testkit.ServeHTTP(t, h), ClientOptions{Token: testClientToken, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	var asked []leaseView
	err = direct.api.call(testkit.Context(t, 10*time.Second), direct.host, "/v1/raft/read", &readManyRequest{Names: names, Stale: true}, &asked, false)
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("a read call for %d names: %v, want 400 naming the limit", len(names), err)
	}

	// An earlier version's member or agent socket answers 404; its agent's
	// TCP address refuses every POST with 403.
	for _, status := range []int{http.StatusNotFound, http.StatusForbidden} {
		old := testkit.ServeHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/raft/read" {
				http.Error(w, "not served here", status)
				return
			}
			h.ServeHTTP(w, r)
		}))
		c, err := Dial(old, ClientOptions{Token: testClientToken, PlainTCP: true})
		if err != nil {
			t.Fatal(err)
		}
		viaOld := newBackend(t, c, cfg)
		checkLeaders(t, viaOld, names[:10], map[int]string{0: held[0]})
	}
}
