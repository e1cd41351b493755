//go:build linux

// Package netns gives tests, and test programs such as a fault harness, a
// private IPv4 network of "hosts", each a Linux network namespace, that they
// can partition and heal while processes run on it. Tests use New; programs
// that are not tests use Open and Available.
//
// # What is guaranteed
//
// Nothing is created in the root network namespace, the one the test process
// and the rest of the machine use. A Net is a "switch" namespace holding a
// bridge, plus one namespace per host with a veth cable into that bridge.
// The root namespace therefore has no interface, address or route of the
// Net's subnet (10.213.X.0/24, X random per Net, picked so that no root
// address is in it), and the hosts have no route anywhere but that subnet. Two rules follow for tests:
//
//   - A host's address is reached only from inside a host namespace, by a
//     process started with Host.Command. From the test process it would
//     follow the machine's default route and leave the machine. Talk to the
//     processes through their stdin/stdout, or through Unix sockets in a
//     t.TempDir (pathname sockets are not scoped by network namespace).
//   - Servers listen on loopback or on their host's address, never on
//     addresses of the root namespace. Inside a host any port is free, since
//     each host has its own stack, so fixed ports are fine there.
//
// Partition cuts hosts apart with nftables rules inside each host namespace
// that drop, in both directions, every IPv4 packet to and from the hosts in
// other groups. Dropped, not rejected: TCP connects and writes hang until
// their timeouts, as on a real partition, and established connections stall
// rather than reset. One difference from a real network: a host's own UDP
// sends to a blocked peer fail at once with EPERM, because the drop happens
// in that host's output path. IPv6 is not configured on the Net (the
// interfaces get no link-local address), so it cannot bypass the rules.
//
// A partition is not atomic across hosts: rules are replaced host by host.
// Since each host drops both directions, a pair of hosts is cut as soon as
// either of them is updated, and healed only once both are.
//
// # Cleanup
//
// New registers Close with t.Cleanup; a program that used Open calls Close
// itself. Close kills every process still inside
// the Net's namespaces (deleting a namespace would leave them running, on a
// network that no longer has a name) and then deletes the namespaces; the
// veth cables and the bridge go with them.
//
// If the process dies without closing its Nets (killed, or a go test
// -timeout panic that skips cleanups), the processes started with Host.Command die with it
// (they get SIGKILL as their parent-death signal; their own children do
// not), but the namespaces stay. Namespace names carry the creating
// process's pid, "baton-PID-RANDOM-h0", and the first Available, Open,
// Require or New of every later process deletes the namespaces whose creator is gone, killing
// what is left inside them.
//
// # Requirements
//
// Root, the `ip` command (Debian package iproute2) and the `nft` command
// (Debian package nftables), and a kernel with network namespaces, veth,
// bridge and nf_tables. Available checks all of that by building a small
// namespace once per process, and says what is missing. Without it, tests
// skip on a developer's machine and fail in CI (see Require), and Open
// returns Available's error.
package netns

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireEnv is the environment variable that decides what Require does when
// namespaces are unavailable: "1" fails the test, "0" skips it, and when it
// is unset or anything else the test fails if CI=true and skips otherwise.
const RequireEnv = "BATON_REQUIRE_NETNS"

const (
	// namePrefix starts the name of every namespace this package creates, so
	// that sweep can tell them from everyone else's.
	namePrefix = "baton-"

	// cmdTimeout bounds one `ip` or `nft` invocation. They normally take
	// milliseconds; the bound turns a wedged one into an error instead of a
	// test that hangs until the go test timeout, which skips cleanups.
	cmdTimeout = 30 * time.Second

	// killTimeout bounds how long Close waits for killed processes to leave
	// a namespace. SIGKILL cannot be caught, so only a process stuck in the
	// kernel (uninterruptible sleep) takes longer.
	killTimeout = 10 * time.Second

	// pollInterval is how often Close checks whether a namespace has emptied;
	// the kernel offers no notification for that.
	pollInterval = 10 * time.Millisecond
)

// namePattern matches the namespaces this package creates and captures the
// pid of the process that created them.
var namePattern = regexp.MustCompile(`^baton-([0-9]+)-[0-9a-f]{6}-(sw|probe|h[0-9]+)$`)

// tools are the absolute paths of the commands the package runs.
type tools struct {
	ip  command
	nft string

	// ipv6 is whether the kernel has IPv6, which interfaces then have to be
	// kept from using; see noIPv6.
	ipv6 bool
}

// setup is what the first Require, Available or Open of the process found
// out.
var setup struct {
	once  sync.Once
	tools tools
	err   error // why namespaces are unavailable, wrapping ErrUnavailable

	// What the sweep of the first call removed, and why it could not
	// remove more; the first Require logs them.
	removed  []string
	sweepErr error
	logOnce  sync.Once
}

// ensureSetup probes the machine and sweeps leftovers, once per process.
func ensureSetup() error {
	setup.once.Do(func() {
		setup.tools, setup.err = probe()
		if setup.err != nil {
			setup.err = fmt.Errorf("%w: %w", ErrUnavailable, setup.err)
			return
		}
		// Leftovers cost nothing but a little kernel memory: a failure to
		// remove them is reported, but does not stop this process from
		// building its own Nets.
		setup.removed, setup.sweepErr = sweep(setup.tools)
	})
	return setup.err
}

// Available returns nil if this process can build namespaced networks, or
// an error wrapping ErrUnavailable that says why not in plain words (not
// root, `ip` or `nft` missing and the Debian package that provides it, or
// what the kernel refused), for programs to print. It checks once per
// process, by building and removing a small namespace with a bridge, a veth
// pair and nftables rules, and later calls return the same answer. The
// first call also deletes namespaces left behind by processes that died
// without cleaning up (see the package doc). It is safe for concurrent use.
func Available() error { return ensureSetup() }

// Require ends the test unless this process can build namespaced networks,
// as Available checks: it runs as root, finds `ip` and `nft`, and the
// kernel lets it create a namespace with a bridge, a veth pair and nftables
// rules.
//
// When they are unavailable the test fails if BATON_REQUIRE_NETNS=1, or if
// CI=true and BATON_REQUIRE_NETNS is not "0"; otherwise it is skipped. The
// message names what is missing and the Debian package that provides it.
// CI jobs that cannot run as root set BATON_REQUIRE_NETNS=0 to skip.
//
// The first call in a process logs the namespaces left behind by dead
// processes that the first Available, Open or Require removed.
//
// New calls Require itself. Require is safe for concurrent use.
func Require(t testing.TB) {
	t.Helper()
	err := ensureSetup()
	if err == nil {
		setup.logOnce.Do(func() {
			if len(setup.removed) > 0 {
				t.Logf("netns: removed namespaces left by dead test processes: %s", strings.Join(setup.removed, " "))
			}
			if setup.sweepErr != nil {
				t.Logf("netns: removing leftover namespaces: %v", setup.sweepErr)
			}
		})
		return
	}
	if required(os.Getenv) {
		t.Fatalf("%v\n(failing rather than skipping because %s)", err, requiredWhy(os.Getenv))
	}
	t.Skipf("%v\n(set %s=1 to fail instead of skip)", err, RequireEnv)
}

// required reports whether unavailable namespaces must fail tests.
func required(getenv func(string) string) bool {
	switch getenv(RequireEnv) {
	case "1":
		return true
	case "0":
		return false
	}
	return getenv("CI") == "true"
}

// requiredWhy names the setting that made required true.
func requiredWhy(getenv func(string) string) string {
	if getenv(RequireEnv) == "1" {
		return RequireEnv + "=1"
	}
	return "CI=true (set " + RequireEnv + "=0 to skip)"
}

// probe finds the tools and builds a throwaway namespace exercising every
// kernel feature a Net uses, so that a missing one is reported by Require
// rather than as a confusing failure halfway through New.
func probe() (tools, error) {
	var tl tools
	var missing []error
	ip, err := lookTool("ip")
	if err != nil {
		missing = append(missing, fmt.Errorf("`ip` not found (install Debian package iproute2): %w", err))
	}
	tl.ip = command(ip)
	if tl.nft, err = lookTool("nft"); err != nil {
		missing = append(missing, fmt.Errorf("`nft` not found (install Debian package nftables): %w", err))
	}
	if euid := os.Geteuid(); euid != 0 {
		missing = append(missing, fmt.Errorf("running as uid %d, not root: creating network namespaces needs root", euid))
	}
	if len(missing) > 0 {
		return tl, errors.Join(missing...)
	}

	_, err = os.Stat("/proc/net/if_inet6")
	tl.ipv6 = err == nil

	name := newID() + "-probe"
	if err := tl.ip.run("", "netns", "add", name); err != nil {
		return tl, err
	}
	err = errors.Join(
		tl.ip.run(batch(
			"link add br0 type bridge",
			"link add v0 type veth peer name v1",
			tl.noIPv6("v0"),
			"link set v0 master br0 up",
		), "-n", name, "-batch", "-"),
		tl.nftScript(name, rulesScript([]netip.Addr{netip.MustParseAddr("192.0.2.1")})),
	)
	return tl, errors.Join(err, tl.removeNamespace(name))
}

// lookTool finds a command in PATH or, since a non-login root shell or a CI
// runner may lack them in PATH, in the sbin directories iproute2 and
// nftables install into.
func lookTool(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, statErr := os.Stat(p); statErr == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", err
}

// newID returns a fresh name stem, "baton-PID-RANDOM". The pid lets sweep
// find leftovers of dead processes; the random part keeps the Nets of one
// process apart.
func newID() string {
	return fmt.Sprintf("%s%d-%06x", namePrefix, os.Getpid(), rand.Uint32()&0xffffff)
}

// sweep deletes the namespaces this package created in processes that no
// longer exist, and returns their names.
func sweep(tl tools) ([]string, error) {
	names, err := tl.ip.namespaces()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, name := range names {
		m := namePattern.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		if err := tl.removeNamespace(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// alive reports whether a process with this pid exists. A reused pid makes a
// leftover look alive; it is then swept by a later process instead.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// removeNamespace kills every process inside the named namespace, waits for
// them to be gone, and deletes the namespace. Deleting it first would only
// remove its name: the processes would keep it, and its interfaces, alive.
func (tl tools) removeNamespace(name string) error {
	if err := tl.killAll(name); err != nil {
		return err
	}
	return tl.ip.run("", "netns", "delete", name)
}

// killAll sends SIGKILL to the processes in the named namespace until none is
// left. It loops because a process may fork between listing and killing.
// Killed processes that their parent has not reaped yet are zombies, which
// no longer hold the namespace, so they do not keep this waiting.
func (tl tools) killAll(name string) error {
	deadline := time.Now().Add(killTimeout)
	for {
		pids, err := tl.ip.pids(name)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in namespace %s %v after SIGKILL", pids, name, killTimeout)
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill process %d in namespace %s: %w", pid, name, err)
			}
		}
		time.Sleep(pollInterval)
	}
}

// nftScript applies an nft script inside the named namespace, as one
// transaction.
func (tl tools) nftScript(ns, script string) error {
	return tl.ip.run(script, "netns", "exec", ns, tl.nft, "-f", "-")
}

// command is the path of an external command.
type command string

// run runs the command with stdin and returns an error that includes its
// arguments and standard error when it fails. Like the other helpers below
// the exported API, it leaves adding the package prefix to its callers.
func (c command) run(stdin string, args ...string) error {
	_, err := c.output(stdin, args...)
	return err
}

// output runs the command with stdin and returns its standard output.
func (c command) output(stdin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, string(c), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s",
			filepath.Base(string(c)), strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// namespaces lists the named network namespaces.
func (c command) namespaces() ([]string, error) {
	out, err := c.output("", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// Lines are "NAME" or "NAME (id: N)".
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, sc.Err()
}

// pids lists the processes inside the named namespace.
func (c command) pids(ns string) ([]int, error) {
	out, err := c.output("", "netns", "pids", ns)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("ip netns pids %s printed %q", ns, out)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
