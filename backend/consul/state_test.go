package consul_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

func storeState(t *testing.T, st baton.StateTerm, v string) {
	t.Helper()
	if err := st.StoreState(testkit.Context(t, 10*time.Second), []byte(v)); err != nil {
		t.Fatalf("StoreState(%q): %v", v, err)
	}
}

// rawState reads key with a consistent read, or nil if it does not exist.
func rawState(t *testing.T, c *api.Client, key string) *api.KVPair {
	t.Helper()
	p, _, err := c.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return p
}

func stateValue(t *testing.T, c *api.Client, key string) string {
	t.Helper()
	p := rawState(t, c, key)
	if p == nil {
		return "<none>"
	}
	return string(p.Value)
}

// TestStateKeyLayout: the state key lies beside the lock key, is not
// locked, and leaves the lock key (what `consul lock` and Leader read)
// alone.
func TestStateKeyLayout(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 3 * time.Second}, Prefix: prefix}, nil)
	key, err := b.StateKey("nightly/report")
	if err != nil || key != prefix+"nightly/report/.baton-state" {
		t.Fatalf("StateKey(nightly/report) = %q, %v; want %q", key, err, prefix+"nightly/report/.baton-state")
	}
	if _, err := b.StateKey("a//b"); err == nil {
		t.Errorf("StateKey accepted a name that Key refuses")
	}
	term := testkit.StateTerm(t, testkit.CampaignWithin(t, b, "nightly/report", "host-1", 10*time.Second))
	if v, err := term.LoadState(testkit.Context(t, 5*time.Second)); err != nil || v != nil {
		t.Fatalf("LoadState of a new lease = %q, %v; want nil", v, err)
	}
	storeState(t, term, "slot 7")
	p := rawState(t, c, key)
	if p == nil || string(p.Value) != "slot 7" || p.Session != "" || p.Flags != 0 {
		t.Errorf("state key = %+v; want value %q, no session, no flags", p, "slot 7")
	}
	lock := rawState(t, c, prefix+"nightly/report/.lock")
	if lock == nil || tokenAt(t, c, b, "nightly/report", lock.ModifyIndex) != term.Token() || lock.Flags != api.LockFlagValue {
		t.Errorf("lock key after StoreState = %+v; want it untouched, at the index of token %d", lock, term.Token())
	}
	if rec, err := b.Leader(testkit.Context(t, 5*time.Second), "nightly/report"); err != nil || rec.Holder != "host-1" || rec.Token != term.Token() {
		t.Errorf("Leader = %+v, %v; want host-1 with token %d", rec, err, term.Token())
	}
	// An empty value is a stored state, unlike none.
	storeState(t, term, "")
	if v, err := term.LoadState(testkit.Context(t, 5*time.Second)); err != nil || v == nil || len(v) != 0 {
		t.Errorf("LoadState after storing nothing = %#v, %v; want an empty, non-nil value", v, err)
	}
	storeState(t, term, "slot 8")
	// The state outlives the term and its lock key.
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if v := stateValue(t, c, key); v != "slot 8" {
		t.Errorf("after Resign the state key holds %q, want %q", v, "slot 8")
	}
}

// TestStoreFencesLostHolder: a term whose lock is gone cannot store,
// whether or not its watch has told it yet: the transaction's checks fail
// in the store, the term ends with ErrLeaseLost, and the state is
// unchanged. bypass skips StoreState's look at the term, so that the store
// alone must refuse.
func TestStoreFencesLostHolder(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	ways := map[string]func(t *testing.T, lockKey string){
		"session destroyed": func(t *testing.T, lockKey string) {
			if _, err := c.Session().Destroy(sessionOf(t, c, lockKey), nil); err != nil {
				t.Fatal(err)
			}
		},
		"lock key deleted": func(t *testing.T, lockKey string) {
			if _, err := c.KV().Delete(lockKey, nil); err != nil {
				t.Fatal(err)
			}
		},
		"lock key rewritten": func(t *testing.T, lockKey string) {
			// Still locked by the term's session, at another index.
			if _, err := c.KV().Put(&api.KVPair{Key: lockKey, Flags: api.LockFlagValue, Value: []byte("someone")}, nil); err != nil {
				t.Fatal(err)
			}
		},
	}
	for what, lose := range ways {
		for _, bypass := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/bypass=%t", what, bypass), func(t *testing.T) {
				prefix := testPrefix()
				b := newBackend(t, agentClient(t, agent, agent.Addr()), consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)
				key, _ := b.StateKey("job")
				term := testkit.StateTerm(t, testkit.CampaignWithin(t, b, "job", "a", 10*time.Second))
				storeState(t, term, "before")
				lose(t, prefix+"job/.lock")
				var err error
				if bypass {
					err = consul.StoreFenced(testkit.Context(t, 10*time.Second), term, []byte("after"))
				} else {
					err = term.StoreState(testkit.Context(t, 10*time.Second), []byte("after"))
				}
				if !errors.Is(err, baton.ErrLeaseLost) {
					t.Fatalf("StoreState after the lock was lost: %v, want ErrLeaseLost", err)
				}
				if v := stateValue(t, c, key); v != "before" {
					t.Fatalf("state = %q after the refused write, want %q", v, "before")
				}
				testkit.WaitDone(t, term, 5*time.Second)
				if !errors.Is(term.Err(), baton.ErrLeaseLost) {
					t.Errorf("term ended with %v, want ErrLeaseLost", term.Err())
				}
				if v, err := term.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "before" {
					t.Errorf("the lost term's LoadState = %q, %v; want %q", v, err, "before")
				}
			})
		}
	}
}

// TestStoreFencesEarlierTermOfSameSession: a Backend's session locks a key
// again in a later term; the earlier term's write must still fail, which
// takes the check of the lock's index, not only of its session.
func TestStoreFencesEarlierTermOfSameSession(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 20 * time.Second}, Prefix: prefix}, nil)
	key, _ := b.StateKey("job")
	first := testkit.StateTerm(t, testkit.CampaignWithin(t, b, "job", "a", 10*time.Second))
	storeState(t, first, "first")
	sid := sessionOf(t, c, prefix+"job/.lock")
	if _, err := c.KV().Delete(prefix+"job/.lock", nil); err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, first, 5*time.Second)
	second := testkit.StateTerm(t, testkit.CampaignWithin(t, b, "job", "a", 10*time.Second))
	if s := sessionOf(t, c, prefix+"job/.lock"); s != sid {
		t.Fatalf("the second term rides on session %s, not %s: the test needs the same one", s, sid)
	}
	storeState(t, second, "second")
	if err := consul.StoreFenced(testkit.Context(t, 10*time.Second), first, []byte("stale")); !errors.Is(err, baton.ErrLeaseLost) {
		t.Errorf("the earlier term's store: %v, want ErrLeaseLost", err)
	}
	if v := stateValue(t, c, key); v != "second" {
		t.Errorf("state = %q, want the later term's %q", v, "second")
	}
	if err := second.Err(); err != nil {
		t.Errorf("the earlier term's refused write ended the later term: %v", err)
	}
	storeState(t, second, "second again")
}

// TestConsulLockWithState: the real `consul lock` works on the prefix of a
// lease that has state, leaves the state alone, and a baton term it
// replaced cannot overwrite the state while it holds.
func TestConsulLockWithState(t *testing.T) {
	agent := testserver.SharedConsul(t)
	c := agentClient(t, agent, agent.Addr())
	prefix := testPrefix()
	const lease = "job"
	b := newBackend(t, c, consul.Options{Config: backend.Config{TTL: 4 * time.Second}, Prefix: prefix}, nil)
	key, _ := b.StateKey(lease)
	file := filepath.Join(t.TempDir(), "marks")

	ta := testkit.StateTerm(t, testkit.CampaignWithin(t, b, lease, "alpha", 10*time.Second))
	storeState(t, ta, "from baton")
	// Still excluded while baton holds.
	try := startLock(t, agent, "-timeout=1s", prefix+lease, "true")
	if code := try.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("consul lock succeeded while baton held the lease:\n%s", try.out)
	}
	if err := ta.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}

	cl := startLock(t, agent, "-name=cli-holder", prefix+lease, fmt.Sprintf(markerScript, file))
	testkit.EventuallyErr(t, 15*time.Second, "the CLI's child to start", func() error {
		if starts, _ := marks(t, file); len(starts) == 0 {
			return errors.New("the CLI's child has not started")
		}
		return nil
	})
	// The replaced term's write is refused by the store while the CLI
	// holds the lock.
	if err := consul.StoreFenced(testkit.Context(t, 10*time.Second), ta, []byte("stale")); !errors.Is(err, baton.ErrLeaseLost) {
		t.Errorf("a replaced term's store while consul lock holds: %v, want ErrLeaseLost", err)
	}
	if err := cl.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := cl.wait(t, 15*time.Second); code != 0 {
		t.Errorf("consul lock exited with %d after SIGTERM; want 0:\n%s", code, cl.out)
	}
	// A run to completion, which cleans up its lock key on the way out.
	if code := startLock(t, agent, "-timeout=10s", prefix+lease, "true").wait(t, 30*time.Second); code != 0 {
		t.Errorf("consul lock on a prefix with state exited with %d; want 0", code)
	}
	if v := stateValue(t, c, key); v != "from baton" {
		t.Errorf("after consul lock, the state key holds %q, want %q", v, "from baton")
	}
	tb := testkit.StateTerm(t, testkit.CampaignWithin(t, b, lease, "beta", 10*time.Second))
	if v, err := tb.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "from baton" {
		t.Errorf("the next baton term's LoadState = %q, %v; want %q", v, err, "from baton")
	}
	storeState(t, tb, "from beta")
}
