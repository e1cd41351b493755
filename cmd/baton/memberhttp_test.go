package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// raftTestSecret is the group secret of the multi-process raft tests here.
const raftTestSecret = "views-test-secret-0123456789"

// raftMaterial makes a CA in dir/ca and a certificate per name in dir
// (NAME.pem, NAME-key.pem) with `baton tls`.
func raftMaterial(t *testing.T, dir string, names ...string) {
	t.Helper()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	for _, name := range names {
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name); r.code != 0 {
			t.Fatalf("tls cert %s: %d %s", name, r.code, r.stderr)
		}
	}
}

// memberArgs are the member flags of NAME (its certificate from raftMaterial)
// binding bind and finding its peers at join.
func memberArgs(dir, name, bind string, join []string, expect int) []string {
	return []string{"--bind", bind, "--join", "static:" + strings.Join(join, ","), "--bootstrap-expect", fmt.Sprint(expect),
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem")}
}

// getJSON GETs url and decodes its JSON body into v; false when the call
// failed or answered another status than 200.
func getJSON(url string, v any) bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
}

// is-leader and leader read from the --http of a `baton run --backend
// raft://`, as they read from an agent, with the same exit statuses: 0
// this instance leads / printed the holder, 1 another does or nobody, 3
// nobody answers. No second daemon runs.
func TestIsLeaderReadsRunHTTP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftMaterial(t, dir, "m1")
	bind, httpAddr := freePort(t), freePort(t)
	run := startBaton(t, "m1", testEnv("BATON_SECRET="+raftTestSecret),
		append(append([]string{"run", "--backend", "raft://", "--lease", "job", "--id", "m1", "--voters", "1", "--http", httpAddr},
			memberArgs(dir, "m1", bind, []string{bind}, 1)...), "--", "sleep", "600")...)
	backend := "agent://" + httpAddr
	testkit.Eventually(t, 60*time.Second, "is-leader --id m1 through run --http to say 0", func() bool {
		return runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "job", "--id", "m1").code == 0
	})
	if r := runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "job", "--id", "m2", "-v"); r.code != 1 || !strings.Contains(r.stdout, "holder=m1") {
		t.Errorf("is-leader --id m2 through run --http: exit %d %q %s, want 1 naming holder m1", r.code, r.stdout, r.stderr)
	}
	r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "job", "--json")
	var doc leaderJSON
	if err := json.Unmarshal([]byte(r.stdout), &doc); r.code != 0 || err != nil || doc.Holder == nil || *doc.Holder != "m1" || doc.Token == "" {
		t.Errorf("leader --json through run --http: exit %d %q %s, want 0 with holder m1 and a token", r.code, r.stdout, r.stderr)
	}
	// The token is the one the run's own lease view shows.
	var view struct {
		Token string `json:"token"`
	}
	if !getJSON("http://"+httpAddr+"/v1/leases/job", &view) || view.Token != doc.Token {
		t.Errorf("leader printed token %s, the run's /v1/leases/job says %s", doc.Token, view.Token)
	}
	if r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "nobody-holds-this"); r.code != 1 || !strings.Contains(r.stderr, "nobody holds") {
		t.Errorf("leader of a free lease through run --http: exit %d %s, want 1 saying nobody holds it", r.code, r.stderr)
	}
	_ = run.cmd.Process.Signal(syscall.SIGKILL)
	run.wait(t, 30*time.Second)
	if r := runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "job", "--id", "m1", "--timeout", "2s"); r.code != 3 {
		t.Errorf("is-leader with the run gone: exit %d %s, want 3 (undetermined)", r.code, r.stderr)
	}
}

// An agent killed with SIGKILL leaves its socket file behind; a `baton run
// --backend raft:// --http` that later takes the agent's HTTP address must
// still be read by agent://ADDR, which would otherwise try the dead socket
// that the file names for ADDR until --timeout.
func TestKilledAgentSocketDoesNotHideRunHTTP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	agent, httpAddr := startAgent(t, filepath.Join(dir, "agent"))
	sock := agentSocketOf(t, httpAddr)
	_ = agent.cmd.Process.Signal(syscall.SIGKILL)
	agent.wait(t, 30*time.Second)
	if st, err := os.Lstat(sock); err != nil || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the killed agent's socket %s: %v, want a socket file left behind", sock, err)
	}

	raftMaterial(t, dir, "m1")
	bind := freePort(t)
	startBaton(t, "m1", testEnv("BATON_SECRET="+raftTestSecret),
		append(append([]string{"run", "--backend", "raft://", "--lease", "job", "--id", "m1", "--voters", "1", "--http", httpAddr},
			memberArgs(dir, "m1", bind, []string{bind}, 1)...), "--", "sleep", "600")...)
	backend := "agent://" + httpAddr
	testkit.Eventually(t, 60*time.Second, "is-leader --id m1 through the run's --http to say 0", func() bool {
		return runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "job", "--id", "m1", "--timeout", "3s").code == 0
	})
	if r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "job", "--timeout", "3s"); r.code != 0 || !strings.Contains(r.stdout, "holder=m1") {
		t.Errorf("leader through the run's --http beside a dead agent's socket: exit %d %q %s, want 0 naming m1", r.code, r.stdout, r.stderr)
	}
}

// A `baton run --http` on another backend than raft serves no reads for
// agent://, and says so, naming its backend. That answer is a
// configuration error (exit 2: the URL points at the wrong kind of
// process), not an undetermined one (3: no answer within --timeout).
func TestIsLeaderRunHTTPNotRaft(t *testing.T) {
	t.Parallel()
	httpAddr := freePort(t)
	startBaton(t, "mem", testEnv(), "run", "--backend", "memory://", "--lease", "job", "--id", "m1", "--http", httpAddr, "--", "sleep", "600")
	testkit.Eventually(t, 30*time.Second, "the run to lead", func() bool {
		var h struct{ Status string }
		return getJSON("http://"+httpAddr+"/v1/health/leader", &h) && h.Status == "leader"
	})
	for _, cmd := range []string{"is-leader", "leader"} {
		r := runBaton(t, 30*time.Second, cmd, "--backend", "agent://"+httpAddr, "--lease", "job", "--id", "m1", "--timeout", "3s")
		if r.code != exitUsage || !strings.Contains(r.stderr, "not a member of a raft group") || !strings.Contains(r.stderr, "memory://") {
			t.Errorf("%s through a memory:// run's --http: exit %d %s, want %d naming the run's backend", cmd, r.code, r.stderr, exitUsage)
		}
	}
}

// memberGroup is a member's GET /v1/group.
type memberGroup struct {
	ID     string   `json:"id"`
	State  string   `json:"state"`
	Leader string   `json:"leader"`
	Voters []string `json:"voters"`
}

// freePortOn returns a free address on ip, a loopback address, that no
// other test in this process was given.
func freePortOn(t *testing.T, ip string) string {
	t.Helper()
	return testkit.FreeAddr(t, ip)
}

// An agent started on a host whose `baton run` is already a member is not
// a second voter for that host once the group has three hosts: the loss of
// the host (both processes killed -9) costs one vote, and the two other
// hosts keep a majority and hand the lease on. Host A is 127.0.0.1 (a run
// and an agent on two ports), B and C are 127.0.0.2 and 127.0.0.3. A's two
// members and B form the group first (bootstrap-expect 3), as when the
// agent starts before the third instance launches; then C joins. The same
// group also shows: leader reads that agree through every member's --http,
// one view of lease job from every --http (its member an ID that begins
// with the holder's --id), the new holder's elected line naming the lost
// holder, and the raft leader's failures to reach the lost host as a few
// ERROR lines and a summary.
func TestAgentBesideRunIsNotASecondVoter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftMaterial(t, dir, "a-run", "a-agent", "b", "c")
	binds := map[string]string{"a-run": freePortOn(t, "127.0.0.1"), "a-agent": freePortOn(t, "127.0.0.1"),
		"b": freePortOn(t, "127.0.0.2"), "c": freePortOn(t, "127.0.0.3")}
	https := map[string]string{"a-run": freePortOn(t, "127.0.0.1"), "a-agent": freePortOn(t, "127.0.0.1"),
		"b": freePortOn(t, "127.0.0.2"), "c": freePortOn(t, "127.0.0.3")}
	join := []string{binds["a-run"], binds["a-agent"], binds["b"], binds["c"]}
	env := testEnv("BATON_SECRET=" + raftTestSecret)
	procs := map[string]*batonProc{}
	startRun := func(name string) {
		procs[name] = startBaton(t, name, env, append(append([]string{"run", "--backend", "raft://", "--lease", "job", "--id", name,
			"--http", https[name]}, memberArgs(dir, name, binds[name], join, 3)...), "--", "sleep", "600")...)
	}
	startRun("a-run")
	sock := agentSocketOf(t, https["a-agent"])
	t.Cleanup(func() { _ = os.Remove(sock); _ = os.Remove(agentTokenFileOf(sock)) })
	procs["a-agent"] = startBaton(t, "a-agent", env, append([]string{"agent", "--http", https["a-agent"]},
		memberArgs(dir, "a-agent", binds["a-agent"], join, 3)...)...)
	startRun("b")
	group := func(name string) (memberGroup, bool) {
		var g memberGroup
		ok := getJSON("http://"+https[name]+"/v1/group", &g)
		return g, ok && g.ID != ""
	}
	testkit.Eventually(t, 60*time.Second, "A's two members and B in one group", func() bool {
		g, ok := group("b")
		return ok && g.Leader != "" && len(g.Voters) >= 2
	})
	startRun("c")
	cStarted := time.Now()
	ids := map[string]string{}
	testkit.Eventually(t, 60*time.Second, "every member's ID", func() bool {
		for name := range https {
			g, ok := group(name)
			if !ok {
				return false
			}
			ids[name] = g.ID
		}
		return true
	})
	var last memberGroup
	onePerHost := func() bool {
		g, ok := group("c")
		if !ok {
			return false
		}
		last = g
		onA := 0
		for _, v := range g.Voters {
			if v == ids["a-run"] || v == ids["a-agent"] {
				onA++
			}
		}
		return len(g.Voters) == 3 && onA == 1 && slices.Contains(g.Voters, ids["b"]) && slices.Contains(g.Voters, ids["c"])
	}
	// Not fatal: without one voter per host, the loss below shows what it
	// costs.
	if !testkit.Poll(60*time.Second, 200*time.Millisecond, onePerHost) {
		t.Errorf("voters %v: want three, one per host (C promoted, one of A's run %s and agent %s demoted)", last.Voters, ids["a-run"], ids["a-agent"])
	}
	t.Logf("voters before host A's loss: %v (A: run %s, agent %s), one per host %s after C started", last.Voters, ids["a-run"], ids["a-agent"], time.Since(cStarted).Round(time.Millisecond))

	// Leadership reads agree through every member's --http, run or agent.
	var holders []string
	for _, name := range []string{"a-agent", "a-run", "b", "c"} {
		var lastErr string
		if !testkit.Poll(30*time.Second, 100*time.Millisecond, func() bool {
			r := runBaton(t, 30*time.Second, "leader", "--backend", "agent://"+https[name], "--lease", "job")
			if r.code != 0 {
				lastErr = fmt.Sprintf("exit %d: %s", r.code, r.stderr)
				return false
			}
			holders = append(holders, strings.TrimSpace(r.stdout))
			return true
		}) {
			// What each member's raft says of the group tells a stale
			// leader address in this member from a leader none can reach.
			var views []string
			for _, m := range []string{"a-agent", "a-run", "b", "c"} {
				g, _ := group(m)
				views = append(views, fmt.Sprintf("%s: %+v", m, g))
			}
			// One raw read tells a member that answers 503 at once from
			// one whose forward to the raft leader never completes.
			raw := "no answer"
			c := http.Client{Timeout: 5 * time.Second}
			start := time.Now()
			if resp, err := c.Get("http://" + https[name] + "/v1/raft/lease?name=job"); err != nil {
				raw = fmt.Sprintf("%v after %s", err, time.Since(start).Round(time.Millisecond))
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				raw = fmt.Sprintf("%d %s after %s", resp.StatusCode, bytes.TrimSpace(b), time.Since(start).Round(time.Millisecond))
			}
			t.Errorf("no leader through %s's --http within 30s; last answer: %s; a raw GET /v1/raft/lease: %s; groups: %s", name, lastErr, raw, strings.Join(views, "; "))
		}
	}
	for _, h := range holders[min(1, len(holders)):] {
		if strings.Fields(h)[0] != strings.Fields(holders[0])[0] {
			t.Errorf("members' --http disagree on the holder: %q", holders)
		}
	}

	// One view of the lease from every member's --http, run or agent:
	// the same holder, token, start, member (the holder's raft member,
	// whose ID begins with the holder's --id) and waiters (the two other
	// runs).
	type leaseDoc struct {
		Holder          string `json:"holder"`
		Token           string `json:"token"`
		Since           string `json:"since"`
		Member          string `json:"member"`
		Waiters         int    `json:"waiters"`
		ResignRequested bool   `json:"resign_requested"`
		HeldHere        bool   `json:"held_here"`
	}
	var diff string
	oneView := func() bool {
		var views []leaseDoc
		for _, name := range []string{"a-agent", "a-run", "b", "c"} {
			var v leaseDoc
			if !getJSON("http://"+https[name]+"/v1/leases/job", &v) {
				return false
			}
			if v.HeldHere != (name == v.Holder) {
				diff = fmt.Sprintf("%s says held_here %v of holder %s", name, v.HeldHere, v.Holder)
				return false
			}
			v.HeldHere = false
			views = append(views, v)
		}
		for _, v := range views[1:] {
			if v != views[0] {
				diff = fmt.Sprintf("views of a-agent, a-run, b, c differ: %+v", views)
				return false
			}
		}
		v := views[0]
		if v.Waiters != 2 || !strings.HasPrefix(v.Member, v.Holder+"-") || v.Member != ids[v.Holder] {
			diff = fmt.Sprintf("view %+v: want 2 waiters and the member %s of holder %s", v, ids[v.Holder], v.Holder)
			return false
		}
		return true
	}
	if !testkit.Poll(30*time.Second, 200*time.Millisecond, oneView) {
		t.Errorf("no one view of lease job: %s", diff)
	}

	// Host A is lost: both of its processes at once.
	_ = procs["a-run"].cmd.Process.Kill()
	_ = procs["a-agent"].cmd.Process.Kill()
	killed := time.Now()
	var after string
	testkit.Eventually(t, 60*time.Second, "B or C to hold the lease after host A's loss", func() bool {
		r := runBaton(t, 30*time.Second, "leader", "--backend", "agent://"+https["b"], "--lease", "job", "--json", "--timeout", "3s")
		var doc leaderJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &doc) != nil || doc.Holder == nil || (*doc.Holder != "b" && *doc.Holder != "c") {
			return false
		}
		after = *doc.Holder
		return true
	})
	// The new holder's "elected" line names the holder lost with host A.
	before := strings.TrimPrefix(strings.Fields(holders[0])[0], "holder=")
	t.Logf("holder before host A's loss: %s; after: %s, read %s after the kill", before, after, time.Since(killed).Round(time.Millisecond))
	if before == "a-run" {
		testkit.Eventually(t, 10*time.Second, after+"'s elected line naming a-run, expired", func() bool {
			for _, line := range strings.Split(procs[after].out.String(), "\n") {
				if strings.Contains(line, "msg=elected") && strings.Contains(line, "baton.previous=a-run") &&
					strings.Contains(line, "baton.previous_via="+ids["a-run"]) && strings.Contains(line, `baton.previous_ended="expired`) {
					return true
				}
			}
			return false
		})
	}

	// The raft leader's failures to reach host A are errors, logged once
	// per peer and then summed up once per interval, not once per
	// heartbeat.
	failures := func() (first, summaries, demoted int) {
		for _, name := range []string{"b", "c"} {
			for _, line := range strings.Split(procs[name].out.String(), "\n") {
				switch {
				case !strings.Contains(line, "failed to heartbeat to"):
				case !strings.Contains(line, "level=ERROR"):
					demoted++
				case strings.Contains(line, "(repeated)"):
					summaries++
				default:
					first++
				}
			}
		}
		return first, summaries, demoted
	}
	testkit.Eventually(t, 60*time.Second, "a summary of the heartbeat failures to host A, at level ERROR", func() bool {
		_, summaries, _ := failures()
		return summaries > 0
	})
	if first, summaries, demoted := failures(); first > 8 || demoted > 0 {
		t.Errorf("heartbeat failures to host A's two members: %d lines at ERROR, %d summaries, %d at a lower level; want at most 8 lines (one per peer, per raft leader of B and C, per interval) and none lower", first, summaries, demoted)
	}
}
