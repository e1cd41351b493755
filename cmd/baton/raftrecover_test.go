package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testkit"
)

// recoverMember is one `baton run --backend raft://` of the recovery tests.
type recoverMember struct {
	name, addr, http string
	id               string // raft member ID, from its status
	proc             *batonProc
}

// maxStartToken returns the highest token of the start events in file.
func maxStartToken(file string) uint64 {
	var top uint64
	for _, e := range starts(readEvents(file)) {
		top = max(top, e.token)
	}
	return top
}

// recoverCommandIn returns the `baton raft recover` command that out's
// ERROR line names, if any.
func recoverCommandIn(out string) (member string, lost []string, ok bool) {
	re := regexp.MustCompile(`level=ERROR msg="the group has lost its quorum[^"]*run: baton raft recover --member (\S+) --lost (\S+)`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		return "", nil, false
	}
	return m[1], strings.Split(m[2], ","), true
}

// TestRaftRecoverStatic: three members found by static discovery; two are
// killed with SIGKILL. Nothing can prove them gone, so the survivor does not
// recover by itself: it says at ERROR which voters it lost and the one
// command that recovers it. That command, run as the operator would
// (a real `baton raft recover`), first refuses a request that leaves a lost
// voter out, then recovers the survivor: its job runs again with a token
// above every earlier one, and two replacements join the recovered group
// as voters.
func TestRaftRecoverStatic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "events")
	killLeftoverChildren(t, file)
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", "m", "--host", "127.0.0.1"); r.code != 0 {
		t.Fatalf("tls cert: %d %s", r.code, r.stderr)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "m.pem"), "--tls-key", filepath.Join(dir, "m-key.pem")}
	const secret = "BATON_SECRET=raft-recover-static-secret-0123456789"
	var ms []*recoverMember
	for i := range 5 {
		ms = append(ms, &recoverMember{name: fmt.Sprintf("m%d", i+1), addr: freePort(t), http: freePort(t)})
	}
	start := func(m *recoverMember, join []*recoverMember) {
		var addrs []string
		for _, j := range join {
			addrs = append(addrs, j.addr)
		}
		for try := 1; ; try++ {
			args := append([]string{"run", "--backend", "raft://", "--bind", m.addr, "--join", "static:" + strings.Join(addrs, ","),
				"--bootstrap-expect", "3", "--lease", "work", "--id", m.name, "--ttl", "5s", "--max-ttl", "5s",
				"--http", m.http, "--log-level", "info"}, tlsFlags...)
			args = append(args, "--", self)
			m.proc = startBaton(t, "baton-"+m.name, testEnv(childEnv+"=1", childFileEnv+"="+file, secret), args...)
			// A port that was free a moment ago may be taken before the
			// member binds it (by another test's process, or as an
			// outgoing connection's source port): the member then exits
			// at once, saying so, and starts again on another HTTP port.
			// Its raft address is in every member's join list, and stays.
			if try == 3 || !exitedOnBusyHTTP(m.proc) {
				return
			}
			m.http = freePort(t)
		}
	}
	for _, m := range ms[:3] {
		start(m, ms[:3])
	}
	testkit.Eventually(t, 60*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	for _, m := range ms[:3] {
		testkit.Eventually(t, 30*time.Second, m.name+" a voter", func() bool {
			g, ok := groupView(m.http)
			m.id = g.ID
			return ok && slices.Contains(g.Voters, g.ID)
		})
	}
	holder := starts(readEvents(file))[0].holder
	i := slices.IndexFunc(ms[:3], func(m *recoverMember) bool { return m.name != holder })
	survivor := ms[i]
	var lost []*recoverMember
	for _, m := range ms[:3] {
		if m != survivor {
			lost = append(lost, m)
		}
	}
	for _, m := range lost {
		_ = m.proc.cmd.Process.Kill()
		<-m.proc.done
	}
	oldTop := maxStartToken(file)

	var member string
	var named []string
	testkit.Eventually(t, 60*time.Second, "the survivor's ERROR naming the command", func() bool {
		var ok bool
		member, named, ok = recoverCommandIn(survivor.proc.out.String())
		return ok
	})
	wantLost := []string{lost[0].addr, lost[1].addr}
	slices.Sort(wantLost)
	if member != survivor.addr || !slices.Equal(named, wantLost) {
		t.Fatalf("the ERROR names --member %s --lost %q, want %s and %q", member, named, survivor.addr, wantLost)
	}
	if r := getHTTP("GET", survivor.http, "/v1/health/leader"); r.status == http.StatusOK {
		t.Fatalf("the survivor says it leads before any recovery")
	}

	env := testEnv(secret)
	r := runBatonEnv(t, 60*time.Second, env, append([]string{"raft", "recover", "--member", member, "--lost", named[0]}, tlsFlags...)...)
	if r.code != exitFailure || !strings.Contains(r.stderr, "do not answer either") || !strings.Contains(r.stderr, named[1]) {
		t.Fatalf("raft recover naming one of two lost voters: exit %d, stderr %q; want 1 and a refusal naming %s", r.code, r.stderr, named[1])
	}
	r = runBatonEnv(t, 60*time.Second, testEnv("BATON_SECRET=not-the-group-secret-0123456789"), append([]string{"raft", "recover", "--member", member, "--lost", strings.Join(named, ",")}, tlsFlags...)...)
	if r.code == exitOK {
		t.Fatalf("raft recover with the wrong secret succeeded: %q", r.stdout)
	}
	r = runBatonEnv(t, 60*time.Second, env, append([]string{"raft", "recover", "--member", member, "--lost", strings.Join(named, ",")}, tlsFlags...)...)
	if r.code != exitOK || !strings.Contains(r.stdout, "recovered") {
		t.Fatalf("raft recover: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	t.Logf("raft recover said: %s", strings.TrimSpace(r.stdout))

	testkit.Eventually(t, 60*time.Second, "the survivor's child to run with a higher token", func() bool {
		for _, e := range starts(readEvents(file)) {
			if e.holder == survivor.name && e.token > oldTop && alive(e.pid) {
				return true
			}
		}
		return false
	})

	// Replacements find the survivor and each other, and join. Their
	// ports are chosen now, not with the first members': other tests'
	// processes may have taken a port chosen a minute ago, and a
	// replacement that finds its port taken is started again on new ones.
	repl := ms[3:]
	for attempt := 1; ; attempt++ {
		for _, m := range repl {
			m.addr, m.http = freePort(t), freePort(t)
		}
		for _, m := range repl {
			start(m, []*recoverMember{survivor, repl[0], repl[1]})
		}
		taken := false
		testkit.Eventually(t, 30*time.Second, "the replacements to start, or one to find its port taken", func() bool {
			up := 0
			for _, m := range repl {
				select {
				case <-m.proc.done:
					if strings.Contains(m.proc.out.String(), "address already in use") {
						taken = true
						return true
					}
					t.Fatalf("%s exited:\n%s", m.name, m.proc.out)
				default:
				}
				if strings.Contains(m.proc.out.String(), "member started") {
					up++
				}
			}
			return up == len(repl)
		})
		if !taken {
			break
		}
		if attempt == 3 {
			t.Fatalf("a replacement found its port taken %d times", attempt)
		}
		for _, m := range repl {
			_ = m.proc.cmd.Process.Kill()
			<-m.proc.done
		}
	}
	testkit.Eventually(t, 60*time.Second, "the survivor and the replacements to be the voters", func() bool {
		g, ok := groupView(survivor.http)
		if !ok || len(g.Voters) != 3 {
			return false
		}
		for _, m := range repl {
			rg, ok := groupView(m.http)
			if !ok || !slices.Contains(g.Voters, rg.ID) {
				return false
			}
		}
		return true
	})
}

// TestAWSRecoverLostMajority: three members on a simulated Auto Scaling
// group; two are killed with SIGKILL. While the group's word is all there
// is (one instance shown Terminated by Auto Scaling while EC2 still runs
// it, the other detached from the group and running), the survivor does not
// act: it says at ERROR that they are not proven terminated. Two
// replacement instances arrive during the outage and wait. Once EC2
// reports the lost two terminated, the survivor recovers on its own, the
// job runs again (on the survivor or a replacement) with a token above
// every earlier one, and the replacements join the recovered group as
// voters.
func TestAWSRecoverLostMajority(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	f.AddGroup("web")
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	dir := t.TempDir()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type member struct {
		in   *awsInstance
		http string
		id   string
	}
	launch := func(i int) *awsInstance {
		in := &awsInstance{id: fmt.Sprintf("i-0000000000000ee0%d", i), ip: fmt.Sprintf("127.0.62.%d", i)}
		f.Launch(in.id, "web", "InService", "Healthy", in.ip)
		return in
	}
	start := func(in *awsInstance, i int) *member {
		in.cfg = mockConfig(in.id, in.ip)
		in.mock = startMock(t, 0, in.cfg, "asglifecycle", "--asg-termination-delay-sec", "3600")
		name := fmt.Sprintf("m%d", i)
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name, "--host", in.ip); r.code != 0 {
			t.Fatalf("tls cert: %d %s", r.code, r.stderr)
		}
		m := &member{in: in, http: freePort(t)}
		env := awsEnv(t, f, in.mock.URL, childEnv+"=1", childFileEnv+"="+file, "BATON_SECRET=aws-recover-test-secret-0123456789")
		in.baton = startBaton(t, "baton-"+in.id, env, "run", "--backend", "raft://", "--bind", net.JoinHostPort(in.ip, strconv.Itoa(defaultRaftPort)),
			"--join", "aws-asg", "--bootstrap-expect", "auto", "--ttl", "5s", "--max-ttl", "5s",
			"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"),
			"--lease", "work", "--id", in.id, "--http", m.http, "--log-level", "info", "--", self)
		return m
	}
	// The group launches its three instances together, as an Auto Scaling
	// group of three does: each member's first look at the group sees all
	// three, and can later name the instance behind each member.
	var insts []*awsInstance
	for i := 1; i <= 3; i++ {
		insts = append(insts, launch(i))
	}
	var old []*member
	for i, in := range insts {
		old = append(old, start(in, i+1))
	}
	testkit.Eventually(t, 60*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	for _, m := range old {
		testkit.Eventually(t, 30*time.Second, m.in.id+" a voter", func() bool {
			g, ok := groupView(m.http)
			m.id = g.ID
			return ok && slices.Contains(g.Voters, g.ID)
		})
	}
	holder := starts(readEvents(file))[0].holder
	i := slices.IndexFunc(old, func(m *member) bool { return m.in.id != holder })
	survivor := old[i]
	var lost []*member
	for _, m := range old {
		if m != survivor {
			lost = append(lost, m)
		}
	}
	// The group's word, not EC2's: one instance Terminated in the group's
	// view while it runs, the other detached and running.
	f.Set(lost[0].in.id, func(in *awsfake.Instance) { in.Lifecycle = "Terminated" })
	f.Set(lost[1].in.id, func(in *awsfake.Instance) { in.Group = "" })
	for _, m := range lost {
		_ = m.in.baton.cmd.Process.Kill()
		<-m.in.baton.done
	}
	oldTop := maxStartToken(file)
	testkit.Eventually(t, 60*time.Second, "the survivor's ERROR: not proven terminated", func() bool {
		out := survivor.in.baton.out.String()
		return strings.Contains(out, "level=ERROR") && strings.Contains(out, "not proven terminated") && strings.Contains(out, lost[0].id) && strings.Contains(out, lost[1].id)
	})
	if strings.Contains(survivor.in.baton.out.String(), "recovering the group") {
		t.Fatalf("the survivor recovered on the group's word alone")
	}
	if r := getHTTP("GET", survivor.http, "/v1/health/leader"); r.status == http.StatusOK {
		t.Fatalf("the survivor leads without proof")
	}

	// Replacements arrive during the outage: they find a member with a
	// log and no leader, wait, and say so (not that their configuration is
	// wrong).
	repl := []*member{start(launch(4), 4), start(launch(5), 5)}
	testkit.Eventually(t, 60*time.Second, "the replacements to say the group has no leader", func() bool {
		for _, m := range repl {
			if !strings.Contains(m.in.baton.out.String(), "may have lost its quorum") {
				return false
			}
		}
		return true
	})
	for _, m := range lost {
		f.Terminate(m.in.id)
	}
	terminated := time.Now()
	// The survivor's or a replacement's: both campaign once the group has
	// re-formed.
	testkit.Eventually(t, 120*time.Second, "a child to run with a higher token", func() bool {
		for _, e := range starts(readEvents(file)) {
			if e.token > oldTop && alive(e.pid) {
				return true
			}
		}
		return false
	})
	t.Logf("the job ran again %s after EC2 reported the lost instances terminated", time.Since(terminated).Round(time.Millisecond))

	testkit.Eventually(t, 90*time.Second, "the survivor and the replacements to be the voters", func() bool {
		g, ok := groupView(survivor.http)
		if !ok || len(g.Voters) != 3 {
			return false
		}
		for _, m := range repl {
			rg, ok := groupView(m.http)
			if !ok || !slices.Contains(g.Voters, rg.ID) {
				return false
			}
		}
		return true
	})
}

// exitedOnBusyHTTP waits until p serves HTTP or exits, and reports whether
// it exited because its --http address was taken.
func exitedOnBusyHTTP(p *batonProc) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			out := p.out.String()
			return strings.Contains(out, "--http") && strings.Contains(out, "address already in use")
		case <-time.After(20 * time.Millisecond):
		}
		if strings.Contains(p.out.String(), `msg="serving HTTP"`) {
			return false
		}
	}
	return false
}
