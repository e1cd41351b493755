package consul_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// TestChangeReadsItsGroupOnly: a Backend holding many leases learns of a
// change to one of them by re-reading a group of keys around it, not every
// key it watches. Consul's KV API has no per-key change feed on a prefix
// (and no filter on a listing), so the Backend splits its watched keys
// into groups, each with a blocking query on its own prefix, at a change
// after a quiet while: a change then wakes the one query whose prefix
// holds the key.
func TestChangeReadsItsGroupOnly(t *testing.T) {
	agent := testserver.SharedConsul(t)
	counter := testserver.NewConsulReads()
	cfg := &api.Config{Address: agent.Addr(), Scheme: "http", Token: agent.ManagementToken(), HttpClient: &http.Client{Transport: counter}}
	if caFile, _, _ := agent.TLSFiles(); caFile != "" {
		t.Fatal("the shared agent serves TLS, and the counting client speaks plain HTTP: give the client the agent's CA")
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)
	const n = 600
	terms := make([]baton.Term, n)
	for i := range terms {
		terms[i] = testkit.CampaignWithin(t, b, fmt.Sprintf("many-%03d", i), "x", 10*time.Second)
	}
	// Each lease has two keys (its lock and its epoch): reading them all
	// is 2n entries. At a change after a quiet while the watcher splits
	// them by the digit after "many-": six groups. The test makes such a
	// change (a key of its own under the prefix) whenever a while passed
	// since its last.
	other := agentClient(t, agent, agent.Addr()).KV()
	var nudged time.Time
	testkit.Eventually(t, 30*time.Second, "the watched keys to be split into groups", func() bool {
		if counter.Prefixes() >= 6 {
			return true
		}
		if time.Since(nudged) > 2*time.Second {
			nudged = time.Now()
			if _, err := other.Put(&api.KVPair{Key: prefix + "many-000/nudge", Value: []byte(nudged.String())}, nil); err != nil {
				t.Fatal(err)
			}
		}
		return false
	})
	mark := counter.Answers()
	victim := 123
	if _, err := other.Delete(fmt.Sprintf("%smany-%03d/.lock", prefix, victim), nil); err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, terms[victim], 10*time.Second)
	if !errors.Is(terms[victim].Err(), baton.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", terms[victim].Err())
	}
	for _, size := range counter.AnswersSince(mark) {
		if size >= n {
			t.Errorf("after one key changed, the Backend read %d entries in one answer (%d leases, %d keys); want a group of them, fewer than %d", size, n, 2*n, n)
		}
	}
	for i, term := range terms {
		if i != victim && term.Err() != nil {
			t.Fatalf("lease %d ended with %v; only the deleted key's term may end", i, term.Err())
		}
	}
}

// bigGroupAnswers campaigns for 600 leases on a Backend of its own (two
// keys a lease: a group of 1,200 keys, above the 1,024 the watcher splits
// at), then, while change changes keys under the same prefix every 10 ms
// (so that the group is never quiet long enough to split), counts the
// Backend's answers of the whole group over 3 s.
func bigGroupAnswers(t *testing.T, change func(kv *api.KV, prefix string, i int) error) int {
	t.Helper()
	agent := testserver.SharedConsul(t)
	counter := testserver.NewConsulReads()
	cfg := &api.Config{Address: agent.Addr(), Scheme: "http", Token: agent.ManagementToken(), HttpClient: &http.Client{Transport: counter}}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testPrefix()
	other := agentClient(t, agent, agent.Addr()).KV()
	stop := make(chan struct{})
	changed := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				changed <- nil
				return
			case <-time.After(10 * time.Millisecond):
			}
			if err := change(other, prefix, i); err != nil {
				changed <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-changed; err != nil {
			t.Fatalf("changing keys: %v", err)
		}
	}()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)
	const n = 600
	for i := range n {
		testkit.CampaignWithin(t, b, fmt.Sprintf("many-%03d", i), "x", 10*time.Second)
	}
	mark := counter.Answers()
	time.Sleep(3 * time.Second) // the window over which the answers are counted
	big := 0
	for _, size := range counter.AnswersSince(mark) {
		if size > 1024 {
			big++
		}
	}
	if big == 0 {
		t.Fatal("no answer of the whole group in the window: the group split, and the test shows nothing")
	}
	return big
}

// TestStormingBigGroupIsReadPaced: a group of more keys than the watcher
// splits at, in which the keys of many leases change between two answers
// (as while many processes campaign at once), is re-read at a pace, not back to
// back: every Backend on an agent re-reading its big groups as fast as the
// agent answers would keep the agent busy encoding them, and its other
// requests (reads, campaigns, session renewals) would time out.
func TestStormingBigGroupIsReadPaced(t *testing.T) {
	big := bigGroupAnswers(t, func(kv *api.KV, prefix string, i int) error {
		var ops api.KVTxnOps
		for k := range 32 {
			ops = append(ops, &api.KVTxnOp{Verb: api.KVSet, Key: fmt.Sprintf("%smany-%03d/storm", prefix, k), Value: fmt.Appendf(nil, "%d", i)})
		}
		ok, resp, _, err := kv.Txn(ops, nil)
		if err == nil && !ok {
			err = fmt.Errorf("transaction refused: %v", resp.Errors)
		}
		return err
	})
	// Paced, the group (about 1,230 keys) is read about every 300 ms: 10
	// answers in 3 s. Back to back, the agent answers a read of that
	// size in a few ms, after each 10 ms change.
	if limit := 20; big > limit {
		t.Fatalf("%d answers of the whole group in 3 s while keys of 32 of its leases changed every 10 ms; want at most %d (paced)", big, limit)
	}
}

// TestBigGroupFollowsSingleChanges: a big group in which the keys of one
// lease change at a time, however often (a lease handed over from process
// to process, with thousands of candidates queued under it), is re-read
// after each change, unpaced: a pause there would delay each hand-over.
func TestBigGroupFollowsSingleChanges(t *testing.T) {
	big := bigGroupAnswers(t, func(kv *api.KV, prefix string, i int) error {
		_, err := kv.Put(&api.KVPair{Key: prefix + "many-000/turn", Value: fmt.Appendf(nil, "%d", i)}, nil)
		return err
	})
	// A change every 10 ms over 3 s: up to 300 answers, where a pace
	// would allow about 10.
	if want := 40; big < want {
		t.Fatalf("%d answers of the whole group in 3 s while one of its keys changed every 10 ms; want at least %d (one per change, unpaced)", big, want)
	}
}
