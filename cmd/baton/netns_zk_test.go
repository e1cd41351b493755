//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// zkCutOffTTL is the TTL of both `baton run`s of
// TestNetnsZooKeeperFollowerCutOff: ZooKeeper grants it as the session
// timeout (it lies within the test servers' bounds).
const zkCutOffTTL = 8 * time.Second

// A three-server ZooKeeper ensemble with one server in each of three
// network namespaces. `baton run` a leads through a follower F, talking to
// F alone; b stands by through the other two servers. F's host is then cut
// off from the other two: a and F still talk, but F has lost its leader, the
// server that expires sessions, and hears of a only through F. This is the
// case the zookeeper package's ensemble lag is for: a's term must end by its
// safe-until, before the leader can expire a's session and b take over. A
// watcher in this process checks that never two jobs are alive at once.
func TestNetnsZooKeeperFollowerCutOff(t *testing.T) {
	var why failReason
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED: %s (the logs are above)", why.get())
		}
	})
	fatalf := func(format string, args ...any) {
		t.Helper()
		why.fatalf(t, format, args...)
	}
	nt := netns.New(t, 3)
	hosts := nt.Hosts()
	ips := make([]string, len(hosts))
	for i, h := range hosts {
		ips[i] = h.IP.String()
	}

	start := time.Now()
	ens, err := testserver.NewZooKeeperEnsembleWith(t.TempDir(), len(hosts), testserver.ZooKeeperEnsembleOptions{
		Hosts: ips,
		Command: func(i int, name string, arg ...string) *exec.Cmd {
			return hosts[i].Command(context.Background(), name, arg...)
		},
	})
	if errors.Is(err, testserver.ErrJavaMissing) {
		testserver.Unavailable(t, "zookeeper", err)
	}
	if err != nil {
		t.Fatalf("start zookeeper ensemble in namespaces: %v", err)
	}
	// Registered before Close, so that it runs after it: the logs then end
	// with each server's last word.
	t.Cleanup(func() {
		if t.Failed() {
			for i := range hosts {
				t.Logf("--- zookeeper server %d (%s) log, shortened:\n%s", i, hosts[i], shortLog(ens.Log(i), zkLogNoise, 40))
			}
		}
	})
	t.Cleanup(ens.Close)
	leader := ens.LeaderIndex()
	if leader < 0 {
		fatalf("no zookeeper server says it leads")
	}
	f, g := -1, -1 // F, where a leads through, and the other follower
	for i := range hosts {
		if i == leader {
			continue
		}
		if f < 0 {
			f = i
		} else {
			g = i
		}
	}
	zkAddr := func(i int) string { return ens.Addrs()[i] }
	t.Logf("ensemble ready in %s: leader server %d, a will use follower %d (%s), b servers %d and %d",
		time.Since(start).Round(time.Millisecond), leader, f, hosts[f], leader, g)

	w := startJobWatcher(t, &why)
	ttl := zkCutOffTTL.String()
	a := startZKRun(t, hosts[f], "a", ttl, zkAddr(f))
	first := w.waitHolder(t, 60*time.Second, "", 0)
	if first.holder != "a" {
		fatalf("the first holder is %q, want a (the only candidate)", first.holder)
	}
	b := startZKRun(t, hosts[g], "b", ttl, zkAddr(leader), zkAddr(g))
	// b's health check names a as the holder: b stands by.
	waitStandby(t, &why, b, "a", first.token, 60*time.Second)
	if jobs := w.now(); len(jobs) != 1 || jobs[0] != first {
		fatalf("with b standing by, the live jobs are %v, want a's alone (%v)", jobs, first)
	}
	if mode := ens.Mode(f); mode != "follower" {
		fatalf("zookeeper server %d, a's, is %q, want follower: the test needs a's session on a follower", f, mode)
	}

	// Cut F off: a and its server keep talking, inside F's namespace.
	aCut := len(a.log.String())
	cutAt := time.Now()
	if err := nt.Isolate(hosts[f]); err != nil {
		t.Fatal(err)
	}
	t.Logf("isolated %s (zookeeper server %d and a) in %s", hosts[f], f, time.Since(cutAt).Round(time.Millisecond))
	aStopped := waitNoJob(t, &why, w, "a", 60*time.Second)
	second := w.waitHolder(t, 60*time.Second, "a", first.token)
	bStarted := time.Now()
	if second.holder != "b" {
		fatalf("after the cut the holder is %q, want b", second.holder)
	}
	if n := w.overlaps(); n > 0 {
		fatalf("%d moments with two jobs alive at once: %v", n, w.overlapSamples())
	}
	// a's own account: its term ended because it could not confirm a
	// renewal (it cannot learn of the session's expiry: only the cut-off
	// server is in reach). Either the Elector stopped it a grace period
	// before its safe-until, as renewals lagged (the run then logs the
	// Elector's cause, the term having no error yet), or the term ended at
	// its safe-until with ErrExpired.
	ended := waitLog(t, &why, a, aCut, 60*time.Second, "a logging that its term ended", func(l string) bool {
		return strings.Contains(l, `msg="term ended; stopping the command"`)
	})
	early := findLog(a, aCut, func(l string) bool {
		return strings.Contains(l, `msg="renewals lag: stopping before safe-until"`) &&
			strings.Contains(l, "baton.token="+strconv.FormatUint(first.token, 10))
	})
	safeUntil := "unknown"
	switch {
	case early != "":
		t.Logf("a's term ended early: %s", early)
		if !strings.Contains(ended, "renewals lag") {
			fatalf("a's term was stopped early, but its run logged another reason: %s", ended)
		}
		if _, v, ok := strings.Cut(early, "baton.safe_until_in="); ok {
			if d, err := time.ParseDuration(strings.Fields(v)[0]); err == nil {
				safeUntil = "+" + logTime(t, early).Add(d).Sub(cutAt).Round(time.Millisecond).String()
			}
		}
	case strings.Contains(ended, baton.ErrExpired.Error()):
		t.Logf("a's term ended at its safe-until: %s", ended)
	default:
		fatalf("a's term ended neither early for lagging renewals nor with %q: %s", baton.ErrExpired, ended)
	}
	// The logs' clocks agree (one machine): a's command was gone before b
	// started its own.
	aGone := logTime(t, waitLog(t, &why, a, aCut, 60*time.Second, "a's command stopping", func(l string) bool {
		return strings.Contains(l, `msg="command stopped"`)
	}))
	bChild := logTime(t, waitLog(t, &why, b, 0, 60*time.Second, "b's command starting", func(l string) bool {
		return strings.Contains(l, `msg="child started"`)
	}))
	if !aGone.Before(bChild) {
		fatalf("a's command stopped at %s, not before b's started at %s", aGone.Format(time.StampMilli), bChild.Format(time.StampMilli))
	}
	t.Logf("timeline from the cut (TTL %s): a's job gone after %s (a logged its command stopped at +%s; its safe-until %s), b's job live after %s with token %d > %d (b logged its command started at +%s)",
		zkCutOffTTL, aStopped.Sub(cutAt).Round(time.Millisecond), aGone.Sub(cutAt).Round(time.Millisecond), safeUntil,
		bStarted.Sub(cutAt).Round(time.Millisecond), second.token, first.token, bChild.Sub(cutAt).Round(time.Millisecond))
	if l := findLog(a, aCut, func(l string) bool { return strings.Contains(l, `msg="session not confirmed before safe-until`) }); l != "" {
		t.Logf("a's session: %s", l)
	}

	// Heal: a gets its server back, learns that its session expired, and
	// queues behind b.
	healAt := time.Now()
	if err := nt.Heal(); err != nil {
		t.Fatal(err)
	}
	waitStandby(t, &why, a, "b", second.token, 60*time.Second)
	t.Logf("after the heal, a stands by behind b within %s", time.Since(healAt).Round(time.Millisecond))
	if jobs := w.now(); len(jobs) != 1 || jobs[0] != second {
		fatalf("after the heal the live jobs are %v, want b's alone (%v)", jobs, second)
	}
	if n := w.overlaps(); n > 0 {
		fatalf("%d moments with two jobs alive at once: %v", n, w.overlapSamples())
	}
}

// zkRun is one `baton run --backend zk://...` on a netns host.
type zkRun struct {
	id   string
	host *netns.Host
	cmd  *exec.Cmd
	done chan struct{}
	log  *lockedWriter
}

// startZKRun starts `baton run` with id on h, with a session on servers
// (addresses in the Net, reached from inside h), running demo-job. It is
// stopped (SIGTERM, then kill) when the test ends, and its log shown,
// shortened, if the test failed.
func startZKRun(t *testing.T, h *netns.Host, id, ttl string, servers ...string) *zkRun {
	t.Helper()
	cmd := h.Command(context.Background(), batonBin, "run",
		"--backend", "zk://"+strings.Join(servers, ",")+"/netns",
		"--lease", "cutoff", "--id", id, "--ttl", ttl, "--http", "127.0.0.1:"+nsHTTPPort,
		"--", batonBin, "demo-job")
	r := &zkRun{id: id, host: h, cmd: cmd, done: make(chan struct{}), log: newLockedWriter()}
	// demo-job's lines go to stdout, baton's log to stderr; both here.
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start baton run %s on %s: %v", id, h, err)
	}
	go func() { _ = cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		signalAndWait(cmd, r.done, syscall.SIGTERM, 15*time.Second)
		if t.Failed() {
			t.Logf("--- baton run %s (%s, zk://%s) log, shortened:\n%s", id, h, strings.Join(servers, ","), shortLog(r.log.String(), runLogNoise, 60))
		}
	})
	return r
}

// waitStandby waits until r's health check answers 429 (standby) naming
// holder with token.
func waitStandby(t *testing.T, why *failReason, r *zkRun, holder string, token uint64, d time.Duration) {
	t.Helper()
	var last health
	var lastErr error
	ok := testkit.Poll(d, 100*time.Millisecond, func() bool {
		select {
		case <-r.done:
			return true
		default:
		}
		last, lastErr = nsHealthOf(r.host)
		return lastErr == nil && last.code == http.StatusTooManyRequests && last.Holder == holder && last.Token == token
	})
	select {
	case <-r.done:
		why.fatalf(t, "baton run %s exited while waiting for it to stand by behind %s", r.id, holder)
	default:
	}
	if !ok {
		why.fatalf(t, "%s did not stand by behind %s (token %d) within %s; its health check last said %s (%v)", r.id, holder, token, d, last, lastErr)
	}
}

// waitLog waits until a line of r's log written after offset from satisfies
// match, and returns it.
func waitLog(t *testing.T, why *failReason, r *zkRun, from int, d time.Duration, what string, match func(line string) bool) string {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if l := findLog(r, from, match); l != "" {
			return l
		}
		if time.Now().After(deadline) {
			why.fatalf(t, "no sign of %s within %s", what, d)
		}
		select {
		case <-r.done:
			why.fatalf(t, "baton run %s exited while waiting for %s", r.id, what)
		case <-tick.C:
		}
	}
}

// findLog returns the first line of r's log written after offset from that
// satisfies match, or "".
func findLog(r *zkRun, from int, match func(line string) bool) string {
	s := r.log.String()
	for l := range strings.Lines(s[min(from, len(s)):]) {
		if match(l) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// waitNoJob waits until no live job has holder, and returns when that was
// seen.
func waitNoJob(t *testing.T, why *failReason, w *jobWatcher, holder string, d time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		gone := true
		for _, j := range w.now() {
			if j.holder == holder {
				gone = false
			}
		}
		if gone {
			return time.Now()
		}
		if time.Now().After(deadline) {
			why.fatalf(t, "%s's job still alive after %s (now: %v)", holder, d, w.now())
		}
		<-tick.C
	}
}

var logTimeRE = regexp.MustCompile(`^time=(\S+)`)

// logTime returns the time of a line of baton's log.
func logTime(t *testing.T, line string) time.Time {
	t.Helper()
	m := logTimeRE.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no time in log line %q", line)
	}
	at, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil {
		t.Fatalf("log line %q: %v", line, err)
	}
	return at
}

// Lines left out of the logs shown on failure, where a partition repeats
// them every few hundred milliseconds.
var (
	runLogNoise = []string{"working with token", "failed to connect", "Failed to connect", "connection refused"}
	zkLogNoise  = []string{"Cannot open channel", "ConnectException", "at org.apache", "at java.", "at sun.", "SocketTimeoutException", "NoRouteToHost", "ZooKeeperServer not running", "Close of session 0x0"}
)

// shortLog drops the lines containing any of noise, counting them, and
// keeps the last keep of the rest.
func shortLog(log string, noise []string, keep int) string {
	var kept []string
	dropped := 0
	for l := range strings.Lines(log) {
		if containsAny(l, noise) {
			dropped++
			continue
		}
		kept = append(kept, strings.TrimRight(l, "\n"))
	}
	var b strings.Builder
	if n := len(kept) - keep; n > 0 {
		b.WriteString("(" + strconv.Itoa(n) + " earlier lines left out)\n")
		kept = kept[n:]
	}
	for _, l := range kept {
		b.WriteString(l + "\n")
	}
	fmt.Fprintf(&b, "(%d repetitive lines left out)\n", dropped)
	return b.String()
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
