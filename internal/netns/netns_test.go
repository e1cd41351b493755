//go:build linux

package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

const (
	// reachTimeout bounds a dial that should succeed: generous, since a
	// false failure is a flaky test while a longer bound costs nothing when
	// the dial succeeds, as it then returns at once.
	reachTimeout = 10 * time.Second

	// blockedTimeout bounds a dial that should be dropped. A dial that is
	// not blocked connects in microseconds on a veth, so this can be short;
	// the test waits it out whenever the partition works.
	blockedTimeout = 300 * time.Millisecond

	// exitTimeout bounds how long a killed process takes to be reaped.
	exitTimeout = 10 * time.Second
)

func TestRequired(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"CI": "true"}, true},
		{map[string]string{"CI": "1"}, false},
		{map[string]string{RequireEnv: "1"}, true},
		{map[string]string{RequireEnv: "0", "CI": "true"}, false},
		{map[string]string{RequireEnv: "yes", "CI": "true"}, true},
		{map[string]string{RequireEnv: "yes"}, false},
	} {
		if got := required(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("required with %v = %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestNamePattern(t *testing.T) {
	id := newID()
	for _, suffix := range []string{"-sw", "-probe", "-h0", "-h244"} {
		m := namePattern.FindStringSubmatch(id + suffix)
		if m == nil || m[1] != strconv.Itoa(os.Getpid()) {
			t.Errorf("namePattern.FindStringSubmatch(%q) = %q, want pid %d", id+suffix, m, os.Getpid())
		}
	}
	for _, name := range []string{"baton", "baton-1-abcdef", "baton-1-abcdef-x", "other-1-abcdef-sw", "baton-x-abcdef-sw", "baton-1-abcdef-sw-2"} {
		if namePattern.MatchString(name) {
			t.Errorf("namePattern matches %q, which this package does not create", name)
		}
	}
}

func TestPlan(t *testing.T) {
	hosts := make([]*Host, 4)
	for i := range hosts {
		hosts[i] = &Host{Name: "h" + strconv.Itoa(i), IP: netip.AddrFrom4([4]byte{10, 213, 0, byte(firstHost + i)})}
	}
	a, b, c, d := hosts[0], hosts[1], hosts[2], hosts[3]

	blocked, err := plan(hosts, [][]*Host{{a, c}, {b}, {d}, {}})
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	want := map[*Host][]netip.Addr{
		a: {b.IP, d.IP},
		b: {a.IP, c.IP, d.IP},
		c: {b.IP, d.IP},
		d: {a.IP, b.IP, c.IP},
	}
	for h, w := range want {
		if !slices.Equal(blocked[h], w) {
			t.Errorf("plan blocks %v for %v, want %v", blocked[h], h, w)
		}
	}

	blocked, err = plan(hosts, [][]*Host{hosts, {}})
	if err != nil {
		t.Fatalf("plan with one real group: %v", err)
	}
	for _, h := range hosts {
		if len(blocked[h]) != 0 {
			t.Errorf("plan with everyone in one group blocks %v for %v", blocked[h], h)
		}
	}

	stranger := &Host{Name: "stranger", IP: netip.MustParseAddr("10.213.0.99")}
	_, err = plan(hosts, [][]*Host{{a, b}, {b, stranger, nil}})
	if !errors.Is(err, ErrUnknownHost) {
		t.Errorf("plan with unknown hosts: %v, want ErrUnknownHost", err)
	}
	// Every problem is reported at once.
	for _, s := range []string{"stranger", "<nil host>", "h1 (10.213.0.11) is in groups 0 and 1", "h2 (10.213.0.12) is in no group", "h3 (10.213.0.13) is in no group"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("plan error %q does not mention %q", err, s)
		}
	}
}

// newAgents builds a Net of n hosts and starts an agent in each.
func newAgents(t *testing.T, n int) (*Net, []*agent) {
	t.Helper()
	nt := New(t, n)
	var agents []*agent
	for _, h := range nt.Hosts() {
		agents = append(agents, startAgent(t, h))
	}
	return nt, agents
}

// checkLinks has every agent dial every other and checks that exactly the
// pairs cut reports are blocked. Pairs are checked both ways: i dialling j
// and j dialling i.
func checkLinks(t *testing.T, agents []*agent, cut func(i, j int) bool) {
	t.Helper()
	for i, a := range agents {
		cmd := "dial"
		for j, b := range agents {
			if i == j {
				continue
			}
			timeout := reachTimeout
			if cut(i, j) {
				timeout = blockedTimeout
			}
			cmd += fmt.Sprintf(" %s/%s", b.addr, timeout)
		}
		a.send(t, cmd)
	}
	for i, a := range agents {
		results := a.recv(t, reachTimeout)
		k := 0
		for j, b := range agents {
			if i == j {
				continue
			}
			got := results[k]
			k++
			want := "ok"
			if cut(i, j) {
				want = "timeout"
			}
			if got != want {
				t.Errorf("%v dialling %v: %s, want %s", a.host, b.host, got, want)
			}
		}
	}
}

func none(i, j int) bool { return false }

func TestHostsReachEachOther(t *testing.T) {
	t.Parallel()
	n, agents := newAgents(t, 2)
	checkLinks(t, agents, none)
	for i, h := range n.Hosts() {
		if !n.Prefix().Contains(h.IP) || h.IP.As4()[3] != byte(firstHost+i) {
			t.Errorf("host %d has address %v, want %v with last octet %d", i, h.IP, n.Prefix(), firstHost+i)
		}
	}
}

func TestPartitionAndHeal(t *testing.T) {
	t.Parallel()
	n, agents := newAgents(t, 3)
	hosts := n.Hosts()
	a, b, c := hosts[0], hosts[1], hosts[2]

	// A connection opened before the partition must stall too: raft keeps
	// its connections open, and a partition that spared them would not be
	// one.
	if got := agents[0].call(t, "open "+agents[1].addr.String(), reachTimeout); got[0] != "ok" {
		t.Fatalf("open a->b: %s", got[0])
	}
	if got := agents[0].call(t, "ping "+reachTimeout.String(), reachTimeout); got[0] != "ok" {
		t.Fatalf("ping a->b before partition: %s", got[0])
	}

	if err := n.Partition([]*Host{a, c}, []*Host{b}); err != nil {
		t.Fatalf("Partition: %v", err)
	}
	checkLinks(t, agents, func(i, j int) bool { return i == 1 || j == 1 })
	if got := agents[0].call(t, "ping "+blockedTimeout.String(), blockedTimeout); got[0] != "timeout" {
		t.Errorf("ping a->b on a connection opened before the partition: %s, want timeout", got[0])
	}

	// Isolate replaces the partition rather than adding to it.
	if err := n.Isolate(c); err != nil {
		t.Fatalf("Isolate: %v", err)
	}
	checkLinks(t, agents, func(i, j int) bool { return i == 2 || j == 2 })

	// A bad partition changes nothing.
	if err := n.Partition([]*Host{a}, []*Host{b}); err == nil {
		t.Errorf("Partition leaving out %v succeeded", c)
	}
	checkLinks(t, agents, func(i, j int) bool { return i == 2 || j == 2 })

	if err := n.Heal(); err != nil {
		t.Fatalf("Heal: %v", err)
	}
	checkLinks(t, agents, none)
	if err := n.Heal(); err != nil {
		t.Fatalf("second Heal: %v", err)
	}
}

// TestPartitionReplacesPrevious cuts several hosts at once, each alone and
// the rest together, as a fault harness does, then a different set: each
// Partition must replace the previous rules whole (a host cut before and not
// now reaches everyone again), and Heal must clear them all.
func TestPartitionReplacesPrevious(t *testing.T) {
	t.Parallel()
	n, agents := newAgents(t, 4)
	h := n.Hosts()

	if err := n.Partition([]*Host{h[0]}, []*Host{h[1]}, []*Host{h[2], h[3]}); err != nil {
		t.Fatalf("Partition 0 | 1 | 2 3: %v", err)
	}
	checkLinks(t, agents, func(i, j int) bool { return i <= 1 || j <= 1 })

	if err := n.Partition([]*Host{h[2]}, []*Host{h[3]}, []*Host{h[0], h[1]}); err != nil {
		t.Fatalf("Partition 2 | 3 | 0 1: %v", err)
	}
	checkLinks(t, agents, func(i, j int) bool { return i >= 2 || j >= 2 })

	if err := n.Isolate(h[1]); err != nil {
		t.Fatalf("Isolate 1: %v", err)
	}
	checkLinks(t, agents, func(i, j int) bool { return i == 1 || j == 1 })

	if err := n.Heal(); err != nil {
		t.Fatalf("Heal: %v", err)
	}
	checkLinks(t, agents, none)
}

// TestOpen builds a Net without a testing.TB, as a program would, and checks
// that its Close removes every namespace; Open refuses a bad host count
// before touching anything.
func TestOpen(t *testing.T) {
	t.Parallel()
	Require(t)
	if err := Available(); err != nil {
		t.Fatalf("Available after Require passed: %v", err)
	}
	for _, hosts := range []int{-1, MaxHosts + 1} {
		if n, err := Open(hosts); err == nil {
			n.Close()
			t.Errorf("Open(%d) succeeded", hosts)
		}
	}

	n, err := Open(2)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			n.Close()
		}
	})
	hosts := n.Hosts()
	if len(hosts) != 2 {
		t.Fatalf("Open(2) has hosts %v", hosts)
	}
	agents := []*agent{startAgent(t, hosts[0]), startAgent(t, hosts[1])}
	checkLinks(t, agents, none)
	if err := n.Isolate(hosts[0]); err != nil {
		t.Fatalf("Isolate: %v", err)
	}
	checkLinks(t, agents, func(i, j int) bool { return true })

	names := []string{hosts[0].Name, hosts[1].Name, n.id + "-sw"}
	closed = true
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	listed := namespaces(t)
	for _, name := range names {
		if slices.Contains(listed, name) {
			t.Errorf("namespace %s still listed after Close", name)
		}
	}
}

// TestRootNamespaceIsOffTheSubnet checks, without sending a packet, that the
// test process's namespace has no way onto the Net's subnet, and that hosts
// have no way off it.
func TestRootNamespaceIsOffTheSubnet(t *testing.T) {
	t.Parallel()
	n := New(t, 2)
	prefix := n.Prefix()

	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && prefix.Contains(ip.Unmap()) {
				t.Errorf("root namespace has address %v in %v", a, prefix)
			}
		}
	}

	// No route of the root namespace is specific to the subnet: it would
	// send the hosts' addresses wherever its default route goes, off the
	// machine, which is why tests must not dial them from here.
	for _, r := range ipJSON(t, "-4", "route", "show", "table", "all") {
		dst, _ := r["dst"].(string)
		p, err := netip.ParsePrefix(dst)
		if err != nil {
			if a, aerr := netip.ParseAddr(dst); aerr == nil {
				p = netip.PrefixFrom(a, 32)
			} else {
				continue // "default" and the like
			}
		}
		if p.Bits() >= prefix.Bits() && prefix.Contains(p.Addr()) {
			t.Errorf("root namespace has route %v onto %v", r, prefix)
		}
	}
	for _, h := range n.Hosts() {
		// Asking for a route sends nothing. No route at all, on a machine
		// without a default route, is fine too.
		if out, err := setup.tools.ip.output("", "-json", "route", "get", h.IP.String()); err == nil {
			for _, r := range decodeJSON(t, out) {
				src, _ := r["prefsrc"].(string)
				if a, err := netip.ParseAddr(src); err == nil && prefix.Contains(a) {
					t.Errorf("root namespace would reach %v from %v, on the subnet: %s", h.IP, a, out)
				}
			}
		}

		// Inside a host, only the subnet is routable: 192.0.2.1 (TEST-NET-1)
		// stands for everywhere else, the root namespace included.
		out, err := exec.Command(string(setup.tools.ip), "-n", h.Name, "route", "get", "192.0.2.1").CombinedOutput()
		if err == nil {
			t.Errorf("host %v has a route off the subnet: %s", h, out)
		} else if !strings.Contains(string(out), "unreachable") {
			t.Errorf("ip route get 192.0.2.1 in %v: %v: %s, want network unreachable", h, err, out)
		}
	}
}

func TestAddAndRemoveHost(t *testing.T) {
	t.Parallel()
	n, agents := newAgents(t, 1)
	old := agents[0].host

	h, err := n.AddHost()
	if err != nil {
		t.Fatalf("AddHost: %v", err)
	}
	if h.IP == old.IP || h.Name == old.Name {
		t.Fatalf("AddHost gave %v, like the existing %v", h, old)
	}
	agents = append(agents, startAgent(t, h))
	checkLinks(t, agents, none)

	if err := n.RemoveHost(old); err != nil {
		t.Fatalf("RemoveHost: %v", err)
	}
	if got := n.Hosts(); !slices.Equal(got, []*Host{h}) {
		t.Errorf("Hosts after RemoveHost = %v, want [%v]", got, h)
	}
	if slices.Contains(namespaces(t), old.Name) {
		t.Errorf("namespace %s still listed after RemoveHost", old.Name)
	}
	if err := agents[0].exited(t, exitTimeout); err == nil {
		t.Errorf("agent in removed host exited cleanly; want it killed")
	}

	// The replacement reuses neither the name nor the address.
	h2, err := n.AddHost()
	if err != nil {
		t.Fatalf("AddHost: %v", err)
	}
	if h2.IP == old.IP || h2.Name == old.Name {
		t.Errorf("AddHost after RemoveHost reused %v as %v", old, h2)
	}
	checkLinks(t, []*agent{agents[1], startAgent(t, h2)}, none)

	if err := n.RemoveHost(old); !errors.Is(err, ErrUnknownHost) {
		t.Errorf("second RemoveHost: %v, want ErrUnknownHost", err)
	}
	if err := n.Partition([]*Host{old}, []*Host{h, h2}); !errors.Is(err, ErrUnknownHost) {
		t.Errorf("Partition with a removed host: %v, want ErrUnknownHost", err)
	}
}

// TestAddHostFailureLeavesNothing breaks the switch behind the Net's back so
// that plugging a new host in fails, and checks the half-built host is gone.
func TestAddHostFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	n := New(t, 0)
	n.mu.Lock()
	sw := n.sw
	n.sw = ""
	n.mu.Unlock()
	if err := n.tools.removeNamespace(sw); err != nil {
		t.Fatal(err)
	}

	h, err := n.AddHost()
	if err == nil {
		t.Fatalf("AddHost without a switch succeeded: %v", h)
	}
	if got := n.Hosts(); len(got) != 0 {
		t.Errorf("Hosts after failed AddHost = %v, want none", got)
	}
	for _, name := range namespaces(t) {
		if strings.HasPrefix(name, n.id) {
			t.Errorf("namespace %s left by failed AddHost", name)
		}
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	t.Parallel()
	n, agents := newAgents(t, 2)
	hosts := n.Hosts()

	// A process that is nobody's child in the test: the shell exits at once
	// and leaves sleep orphaned inside the host.
	out, err := hosts[1].Command(t.Context(), "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatalf("start orphan: %v", err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("orphan pid %q: %v", out, err)
	}
	t.Cleanup(func() {
		// Only if Close failed to: a leftover would outlive the test.
		if running(orphan) {
			_ = syscall.Kill(orphan, syscall.SIGKILL)
		}
	})
	if !running(orphan) {
		t.Fatalf("orphan %d not running", orphan)
	}

	names := []string{hosts[0].Name, hosts[1].Name, n.id + "-sw"}
	listed := namespaces(t)
	for _, name := range names {
		if !slices.Contains(listed, name) {
			t.Fatalf("namespace %s not listed before Close: %v", name, listed)
		}
	}

	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	listed = namespaces(t)
	for _, name := range names {
		if slices.Contains(listed, name) {
			t.Errorf("namespace %s still listed after Close", name)
		}
	}
	for _, a := range agents {
		if err := a.exited(t, exitTimeout); err == nil {
			t.Errorf("agent in %v exited cleanly; want it killed by Close", a.host)
		}
	}
	if running(orphan) {
		t.Errorf("orphan %d still running after Close", orphan)
	}

	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := n.AddHost(); !errors.Is(err, ErrClosed) {
		t.Errorf("AddHost after Close: %v, want ErrClosed", err)
	}
	if err := n.Heal(); !errors.Is(err, ErrClosed) {
		t.Errorf("Heal after Close: %v, want ErrClosed", err)
	}
}

// TestSweepRemovesLeftovers plays a test process that died without cleaning
// up: a namespace named for a dead pid, with a process still inside.
func TestSweepRemovesLeftovers(t *testing.T) {
	t.Parallel()
	Require(t)
	tl := setup.tools

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	name := strings.Replace(newID(), strconv.Itoa(os.Getpid()), strconv.Itoa(dead.Process.Pid), 1) + "-h0"
	if err := tl.ip.run("", "netns", "add", name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if slices.Contains(namespaces(t), name) {
			if err := tl.removeNamespace(name); err != nil {
				t.Errorf("remove %s: %v", name, err)
			}
		}
	})
	h := &Host{Name: name, ip: tl.ip}
	sleeper := h.Command(t.Context(), "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleeper.Wait() }()
	// Start returns once `ip netns exec` runs; it enters the namespace a
	// moment later. A sweep before that finds the namespace empty, and the
	// sleeper then lives on in a namespace that no longer has a name.
	testkit.Eventually(t, exitTimeout, "the sleeper inside "+name, func() bool {
		pids, err := tl.ip.pids(name)
		return err == nil && len(pids) > 0
	})

	removed, err := sweep(tl)
	// Another test process sweeping at the same time may remove the
	// namespace first; then this sweep fails on it.
	if !slices.Contains(removed, name) && err == nil {
		t.Errorf("sweep removed %v, want %s among them", removed, name)
	}
	if err != nil {
		t.Logf("sweep: %v", err)
	}
	if slices.Contains(namespaces(t), name) {
		t.Errorf("namespace %s still listed after sweep", name)
	}
	select {
	case err := <-exited:
		if err == nil {
			t.Errorf("process in leftover namespace exited cleanly; want it killed")
		}
	case <-time.After(exitTimeout):
		t.Errorf("process in leftover namespace still running after sweep")
	}
}

// namespaces lists the named network namespaces.
func namespaces(t *testing.T) []string {
	t.Helper()
	names, err := setup.tools.ip.namespaces()
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// running reports whether pid is a live process: neither gone nor a zombie
// waiting to be reaped by whoever adopted it.
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	_, after, ok := strings.Cut(string(stat), ") ")
	return ok && !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
}

// ipJSON runs ip -json with args in the root namespace and decodes its list.
func ipJSON(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	out, err := setup.tools.ip.output("", append([]string{"-json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeJSON(t, out)
}

func decodeJSON(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	var v []map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	return v
}
