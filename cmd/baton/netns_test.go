//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testkit"
)

// A raft group of `baton run` members on hosts in network namespaces: the
// test partitions the lease holder away from the majority and heals it, then
// replaces every original member one by one. Throughout, a watcher in this
// process checks that never two leader-only jobs are alive at once.
func TestNetnsPartitionAndReplace(t *testing.T) {
	// The members' logs are long; the reason for a failure is repeated
	// after them, so that it is at the end of the output.
	var why failReason
	var c *nsCluster
	t.Cleanup(func() {
		// Runs last: after every member stopped and left its log. The
		// output stays short (CI shows a part of it), and the reason is
		// said first and last.
		if !t.Failed() {
			return
		}
		t.Logf("FAILED: %s (the members' shortened logs follow, newest member first)", why.get())
		if c != nil {
			c.mu.Lock()
			for _, l := range c.logs {
				t.Log(l)
			}
			c.mu.Unlock()
		}
		t.Logf("FAILED: %s", why.get())
	})
	nt := netns.New(t, 3)
	dir := t.TempDir()
	ca, err := certs.NewCA("netns test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteFiles(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")); err != nil {
		t.Fatal(err)
	}
	c = &nsCluster{t: t, why: &why, nt: nt, dir: dir, ca: ca, procs: map[string]*nsMember{}}
	w := startJobWatcher(t, &why)

	for _, h := range nt.Hosts() {
		c.ips = append(c.ips, net.JoinHostPort(h.IP.String(), "7390"))
	}
	for _, h := range nt.Hosts() {
		c.start(h)
	}
	first := w.waitHolder(t, 60*time.Second, "", 0)
	t.Logf("first holder %s, token %d", first.holder, first.token)
	for _, h := range nt.Hosts() {
		c.waitInGroup(h, 60*time.Second) // learns each member's node ID
	}

	// Partition the holder away from the majority.
	minority := c.hostOf(first.holder)
	if err := nt.Isolate(minority); err != nil {
		t.Fatal(err)
	}
	second := w.waitHolder(t, 60*time.Second, first.holder, first.token)
	t.Logf("after the partition: holder %s, token %d", second.holder, second.token)
	if c.hostOf(second.holder) == minority {
		c.fatalf("the isolated host %s still leads", minority)
	}
	if err := nt.Heal(); err != nil {
		t.Fatal(err)
	}

	// Replace the original members one by one: a new host joins, then an
	// old one leaves (alternately SIGTERM and kill -9).
	last := second
	var stopped []string
	for i, old := range nt.Hosts()[:3] {
		h, err := nt.AddHost()
		if err != nil {
			t.Fatal(err)
		}
		c.start(h)
		c.waitInGroup(h, 60*time.Second)
		m := c.procs[old.Name]
		sig, sigName := syscall.SIGTERM, "SIGTERM"
		if i%2 == 1 {
			sig, sigName = syscall.SIGKILL, "SIGKILL"
		}
		t.Logf("round %d: %s is in the group; %s to %s (holder %s)", i+1, h, sigName, m.id, last.holder)
		_ = m.cmd.Process.Signal(sig)
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
			// SIGQUIT, for its goroutines in the log (baton forwards it to
			// a running command instead; the kill after 10s ends it then).
			signalAndWait(m.cmd, m.done, syscall.SIGQUIT, 10*time.Second)
			c.fatalf("%s did not stop within 30s of the signal", m.id)
		}
		if strings.Contains(m.log.String(), closeGaveUp) {
			c.fatalf("%s hung closing its backend and exited without it (its goroutines are in its log)", m.id)
		}
		// The job goes on where it was, unless the member that left held
		// the lease: then another takes over with a higher token.
		above := last.token - 1
		if last.holder == m.id {
			above = last.token
		}
		next := w.waitHolder(t, 60*time.Second, m.id, above)
		t.Logf("round %d: %s stopped; holder %s, token %d; waiting for 3 live voters", i+1, m.id, next.holder, next.token)
		stopped = append(stopped, m.nodeID)
		c.waitVoters(c.procs[h.Name], stopped, 60*time.Second)
		t.Logf("round %d: replaced %s", i+1, old)
		last = next
	}
	if n := w.overlaps(); n > 0 {
		c.fatalf("%d moments with two leader-only jobs alive at once: %v", n, w.overlapSamples())
	}
}

type nsCluster struct {
	t     *testing.T
	why   *failReason
	nt    *netns.Net
	dir   string
	ca    *certs.CA
	mu    sync.Mutex
	procs map[string]*nsMember
	ips   []string
	logs  []string // each stopped member's shortened log, once the test failed
}

type nsMember struct {
	id     string
	nodeID string // its raft node ID, once waitInGroup saw it in the group
	host   *netns.Host
	cmd    *exec.Cmd
	done   chan struct{}
	log    *lockedWriter
}

const nsSecret = "netns-test-secret-0123456789"

func (c *nsCluster) hostOf(id string) *netns.Host {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.procs {
		if m.id == id {
			return m.host
		}
	}
	return nil
}

// start runs `baton run --backend raft://` on h.
func (c *nsCluster) start(h *netns.Host) {
	t := c.t
	t.Helper()
	name := h.Name[strings.LastIndexByte(h.Name, '-')+1:]
	certPEM, keyPEM, err := c.ca.Issue(name, []string{h.IP.String()}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(c.dir, name+".pem"), filepath.Join(c.dir, name+"-key.pem")
	if err := certs.WritePair(certFile, keyFile, certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	if addr := net.JoinHostPort(h.IP.String(), "7390"); !slices.Contains(c.ips, addr) {
		c.ips = append(c.ips, addr)
	}
	join := "static:" + strings.Join(c.ips, ",")
	c.mu.Unlock()
	id := "m-" + name
	cmd := h.Command(context.Background(), batonBin, "run",
		"--backend", "raft://", "--bind", net.JoinHostPort(h.IP.String(), "7390"),
		"--join", join, "--bootstrap-expect", "3",
		"--tls-ca", filepath.Join(c.dir, "ca.pem"), "--tls-cert", certFile, "--tls-key", keyFile,
		"--lease", "netns", "--id", id, "--ttl", "3s", "--log-level", "debug", "--http", "127.0.0.1:"+nsHTTPPort,
		"--", batonBin, "demo-job")
	cmd.Env = append(os.Environ(), "BATON_SECRET="+nsSecret)
	lw := newLockedWriter()
	cmd.Stdout, cmd.Stderr = lw, lw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start baton on %s: %v", h, err)
	}
	m := &nsMember{id: id, host: h, cmd: cmd, done: make(chan struct{}), log: lw}
	go func() { _ = cmd.Wait(); close(m.done) }()
	c.mu.Lock()
	c.procs[h.Name] = m
	c.mu.Unlock()
	t.Cleanup(func() {
		signalAndWait(cmd, m.done, syscall.SIGTERM, 15*time.Second)
		if strings.Contains(lw.String(), closeGaveUp) {
			c.why.errorf(t, "%s hung closing its backend and exited without it (its goroutines are in its log)", id)
		}
		if t.Failed() {
			// A SIGQUIT's dump ends the log; the lines before it are the
			// member's last words.
			before, _, _ := strings.Cut(lw.String(), "SIGQUIT: quit")
			l := fmt.Sprintf("--- %s (%s) log, shortened:\n%s%s", id, h,
				shortLog(before, raftRunNoise, 80), goroutines(lw.String()))
			c.mu.Lock()
			c.logs = append(c.logs, l)
			c.mu.Unlock()
		}
	})
}

// signalAndWait sends sig to cmd's process and waits until done is closed
// (cmd.Wait returned), killing the process if that takes longer than d.
func signalAndWait(cmd *exec.Cmd, done <-chan struct{}, sig os.Signal, d time.Duration) {
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
	}
}

// What a member says of its group comes from its --http server (GET
// /v1/group: its node ID, the voters and members of the configuration it
// has, the raft leader), asked from inside its host. The job watcher, not
// a member, tells who leads.

// waitInGroup waits until h's member says it is in a group with a raft
// leader, and notes its node ID.
func (c *nsCluster) waitInGroup(h *netns.Host, d time.Duration) {
	c.t.Helper()
	c.mu.Lock()
	m := c.procs[h.Name]
	c.mu.Unlock()
	var last error
	var g nsGroup
	in := testkit.Poll(d, 100*time.Millisecond, func() bool {
		var ok bool
		g, ok, last = nsGroupOf(h)
		return ok && slices.Contains(g.Members, g.ID)
	})
	if !in {
		c.fatalf("%s did not join the group within %s (last answer %+v, %v)", h, d, g, last)
	}
	c.mu.Lock()
	m.nodeID = g.ID
	c.mu.Unlock()
}

// waitVoters waits until m says its group has 3 voters, none of them a
// stopped member: the group has replaced what it lost (autopilot's
// promotions and dead-member clean-up) and can lose another member.
func (c *nsCluster) waitVoters(m *nsMember, stopped []string, d time.Duration) {
	c.t.Helper()
	var last nsGroup
	var lastErr error
	settled := testkit.Poll(d, 200*time.Millisecond, func() bool {
		g, ok, err := nsGroupOf(m.host)
		if err != nil || !ok {
			lastErr = err
			return false
		}
		last = g
		return len(g.Voters) == 3 && !slices.ContainsFunc(g.Voters, func(v string) bool { return slices.Contains(stopped, v) })
	})
	if !settled {
		c.fatalf("the group did not settle on 3 live voters within %s; %s last said voters %v, members %v (stopped: %v; %v)",
			d, m.id, last.Voters, last.Members, stopped, lastErr)
	}
}

// failReason keeps why the test failed.
type failReason struct {
	mu  sync.Mutex
	why string
}

func (f *failReason) fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatal(f.keep(format, args...))
}

func (f *failReason) errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Error(f.keep(format, args...))
}

// keep formats a failure's reason, and keeps it if it is the first.
func (f *failReason) keep(format string, args ...any) string {
	msg := fmt.Sprintf(format, args...)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.why == "" {
		f.why = msg
	}
	return msg
}

func (f *failReason) get() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.why == "" {
		return "see above"
	}
	return f.why
}

func (c *nsCluster) fatalf(format string, args ...any) {
	c.t.Helper()
	c.why.fatalf(c.t, format, args...)
}

// raftRunNoise is what a member's shortened log leaves out: the job's
// heartbeat, raft's retries to unreachable peers and its debug chatter, and
// the goroutines of a close given up on (goroutines shows them).
var raftRunNoise = []string{"working with token", "failed to heartbeat to", "failed to appendEntries to",
	"raft: failed to contact", "failed to make requestVote RPC", "level=DEBUG msg=\"20", closeGaveUp}

// closeGaveUp is in the log line of a close that baton gave up on
// (closeWithin); the line carries the goroutines.
const closeGaveUp = "did not finish; exiting without waiting"

// goroutines returns, shortened, the goroutines in a member's log that run
// baton's or raft's code: those of a SIGQUIT (the dump ends the log; it may
// be the command's, which gets a forwarded SIGQUIT while it runs), or of a
// close that baton gave up on (one log line). Both are in the format of
// runtime tracebacks: a header line, then a function line and a file line
// per frame.
func goroutines(log string) string {
	var dumps []string
	if _, dump, ok := strings.Cut(log, "SIGQUIT: quit"); ok {
		dumps = append(dumps, dump)
	}
	for l := range strings.Lines(log) {
		if !strings.Contains(l, closeGaveUp) {
			continue
		}
		_, v, _ := strings.Cut(l, "goroutines=")
		if u, err := strconv.Unquote(strings.TrimSpace(v)); err == nil {
			dumps = append(dumps, u)
		}
	}
	var b strings.Builder
	shown := 0
	for _, dump := range dumps {
		for bl := range strings.SplitSeq(dump, "\n\n") {
			if !strings.Contains(bl, "batonhq/baton") && !strings.Contains(bl, "hashicorp/raft") {
				continue
			}
			if shown == 25 {
				b.WriteString("(more goroutines left out)\n")
				break
			}
			shown++
			lines := strings.Split(strings.TrimSpace(bl), "\n")
			b.WriteString(lines[0] + "\n")
			frames := 0
			for i := 1; i < len(lines); i += 2 {
				// The Go runtime's own frames say little here.
				fn := strings.TrimPrefix(lines[i], "created by ")
				if strings.HasPrefix(fn, "runtime") || strings.HasPrefix(fn, "internal/") || strings.HasPrefix(fn, "sync.runtime_") {
					continue
				}
				if frames == 8 {
					b.WriteString("\t…\n")
					break
				}
				frames++
				b.WriteString(lines[i] + "\n")
				if i+1 < len(lines) {
					b.WriteString(lines[i+1] + "\n")
				}
			}
			b.WriteString("\n")
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "goroutines in baton's or raft's code:\n" + b.String()
}

// jobWatcher samples the live demo-job processes of this test's binary
// every few milliseconds (the namespaces share the PID namespace).
type jobWatcher struct {
	why      *failReason
	mu       sync.Mutex
	current  []jobSample
	holder   string
	token    uint64
	overlap  int
	examples []string
	changed  chan struct{}
}

type jobSample struct {
	holder string
	token  uint64
}

func startJobWatcher(t *testing.T, why *failReason) *jobWatcher {
	w := &jobWatcher{why: why, changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			w.sample(liveJobs())
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *jobWatcher) sample(jobs []jobSample) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.current = jobs
	if len(jobs) > 1 {
		w.overlap++
		if len(w.examples) < 5 {
			w.examples = append(w.examples, fmt.Sprint(jobs))
		}
	}
	if len(jobs) == 1 && (jobs[0].holder != w.holder || jobs[0].token != w.token) {
		w.holder, w.token = jobs[0].holder, jobs[0].token
		close(w.changed)
		w.changed = make(chan struct{})
	}
}

// now returns the live jobs of the last sample.
func (w *jobWatcher) now() []jobSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

func (w *jobWatcher) overlaps() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overlap
}

func (w *jobWatcher) overlapSamples() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.examples
}

// waitHolder waits for a live job whose holder is not notHolder and whose
// token is above minToken.
func (w *jobWatcher) waitHolder(t *testing.T, d time.Duration, notHolder string, aboveToken uint64) jobSample {
	t.Helper()
	timeout := time.After(d)
	for {
		w.mu.Lock()
		h, tok, ch := w.holder, w.token, w.changed
		alive := len(w.current) == 1
		w.mu.Unlock()
		if alive && h != notHolder && tok > aboveToken {
			return jobSample{h, tok}
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-timeout:
			w.why.fatalf(t, "no leader-only job with a holder other than %q and a token above %d within %s (now: %v)", notHolder, aboveToken, d, w.now())
		}
	}
}

// liveJobs lists running (not zombie) demo-job processes of batonBin.
func liveJobs() []jobSample {
	var out []jobSample
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.HasPrefix(cmdline, []byte(batonBin+"\x00demo-job")) {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		var s jobSample
		for _, kv := range bytes.Split(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("BATON_HOLDER=")); ok {
				s.holder = string(v)
			}
			if v, ok := bytes.CutPrefix(kv, []byte("BATON_TOKEN=")); ok {
				s.token, _ = strconv.ParseUint(string(v), 10, 64)
			}
		}
		out = append(out, s)
	}
	return out
}
