package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testkit"
)

// httpAddrRE finds the address a baton's --http server listens on in its
// log (--http 127.0.0.1:0 lets the kernel choose the port).
var httpAddrRE = regexp.MustCompile(`msg="serving HTTP" \S*addr=(\S+)`)

// leftAtRE finds when a raft member logged that it left the group.
var leftAtRE = regexp.MustCompile(`time=(\S+) level=INFO msg="left the group"`)

// TestAWSScaleInRaftLeader: the group scales in the raft leader's instance
// through the lifecycle hook. The member leaves the raft configuration,
// the two that remain elect a raft leader and keep the quorum, the lease
// is held by one of them (on a new, higher token when the leaving
// instance held it) whose child runs, no two children ever overlap, and
// CompleteLifecycleAction comes after the member left the configuration.
func TestAWSScaleInRaftLeader(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	insts := awsGroup(t, f, file, "21", "--http", "127.0.0.1:0")

	httpOf := map[*awsInstance]string{}
	raftID := map[*awsInstance]string{}
	for _, in := range insts {
		testkit.Eventually(t, 60*time.Second, in.id+" serving --http", func() bool {
			m := httpAddrRE.FindStringSubmatch(in.baton.out.String())
			if m != nil {
				httpOf[in] = m[1]
			}
			return m != nil
		})
		testkit.Eventually(t, 60*time.Second, in.id+" a voter", func() bool {
			g, ok := groupView(httpOf[in])
			raftID[in] = g.ID
			return ok && len(g.Voters) == 3 && slices.Contains(g.Voters, g.ID)
		})
	}
	testkit.Eventually(t, 60*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })

	// The raft leader, as a member reports it.
	var old *awsInstance
	testkit.Eventually(t, 30*time.Second, "a raft leader", func() bool {
		g, ok := groupView(httpOf[insts[0]])
		for _, in := range insts {
			if ok && raftID[in] == g.Leader {
				old = in
			}
		}
		return old != nil
	})
	evs := readEvents(file)
	first := starts(evs)[len(starts(evs))-1]
	oldHeld := first.holder == old.id
	t.Logf("%s (raft member %s) is the raft leader; %s holds the lease with token %d", old.id, raftID[old], first.holder, first.token)

	// Scale-in: the group puts the instance into Terminating:Wait, and its
	// metadata shows the target lifecycle state Terminated.
	old.mock.Stop()
	old.mock = startMock(t, old.mock.Port, old.cfg, "asglifecycle", "--asg-termination-delay-sec", "0")
	f.BeginTermination(old.id)
	if code := old.baton.wait(t, 60*time.Second); code != 0 {
		t.Errorf("the leaving instance's baton exited %d, want 0 (as on SIGTERM)", code)
	}

	var rest []*awsInstance
	var restIDs []string
	for _, in := range insts {
		if in != old {
			rest = append(rest, in)
			restIDs = append(restIDs, raftID[in])
		}
	}
	slices.Sort(restIDs)
	// The two that remain agree on a raft leader among them, and the
	// configuration holds only them.
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("the remaining members %q to have a leader among them and be the whole configuration", restIDs), func() bool {
		for _, in := range rest {
			g, ok := groupView(httpOf[in])
			if !ok || !slices.Contains(restIDs, g.Leader) ||
				!slices.Equal(slices.Sorted(slices.Values(g.Members)), restIDs) ||
				!slices.Equal(slices.Sorted(slices.Values(g.Voters)), restIDs) {
				return false
			}
		}
		return true
	})

	// The lease: with a new holder on a higher token if the leaving
	// instance held it, else still with its holder; its child runs.
	var holder event
	testkit.Eventually(t, 60*time.Second, "a remaining instance's child to run", func() bool {
		for _, e := range starts(readEvents(file)) {
			if e.holder != old.id && alive(e.pid) {
				holder = e
				return true
			}
		}
		return false
	})
	if oldHeld && holder.token <= first.token {
		t.Errorf("the lease moved from %s to %s on token %d, not above the old %d", old.id, holder.holder, holder.token, first.token)
	}
	if !oldHeld && holder.pid != first.pid {
		t.Errorf("the lease holder %s's child %d was replaced by %d (%s) when another instance left", first.holder, first.pid, holder.pid, holder.holder)
	}
	t.Logf("after the scale-in %s holds the lease with token %d (the leaving instance held it: %v)", holder.holder, holder.token, oldHeld)
	// The lease is alive on the remaining quorum: the holder's status
	// reports it held there.
	for _, in := range rest {
		if in.id != holder.holder {
			continue
		}
		testkit.Eventually(t, 30*time.Second, "the holder's status to report it leads", func() bool {
			r := getHTTP("GET", httpOf[in], "/v1/health/leader")
			return r.err == nil && r.status == 200
		})
	}
	for _, e := range starts(readEvents(file)) {
		if e.others != 0 {
			t.Errorf("child %d of %s (token %d) started while %d other children ran", e.pid, e.holder, e.token, e.others)
		}
	}

	// CompleteLifecycleAction, once, after the member left the
	// configuration (its log says when the leader answered its leave).
	out := old.baton.out.String()
	m := leftAtRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the leaving instance's log does not say it left the group:\n%s", out)
	}
	leftAt, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil {
		t.Fatalf("the time of %q: %v", m[0], err)
	}
	if !strings.Contains(out, "instance terminating") {
		t.Errorf("the leaving instance's log does not give the reason \"instance terminating\"")
	}
	var completes []awsfake.LifecycleCall
	for _, c := range f.LifecycleCalls() {
		switch c.Action {
		case "CompleteLifecycleAction":
			completes = append(completes, c)
		case "Timeout":
			t.Errorf("the hook timed out: %+v", c)
		}
	}
	if len(completes) != 1 {
		t.Fatalf("CompleteLifecycleAction calls: %+v, want one", completes)
	}
	c := completes[0]
	if c.Error != "" || c.InstanceID != old.id || c.Hook != "drain" || c.Result != "CONTINUE" {
		t.Errorf("CompleteLifecycleAction %+v, want CONTINUE for %s and hook drain", c, old.id)
	}
	// The log's time is to the millisecond, rounded down.
	if c.At.Before(leftAt) {
		t.Errorf("CompleteLifecycleAction at %s, before the member left the group at %s", c.At.Format(time.RFC3339Nano), m[1])
	} else {
		t.Logf("left the group at %s; CompleteLifecycleAction %s later", m[1], c.At.Sub(leftAt).Round(time.Millisecond))
	}
}
