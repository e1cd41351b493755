//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

const (
	// MaxHosts is how many hosts a Net can create over its life: its /24
	// gives hosts .10 to .254, and addresses of removed hosts are not reused.
	MaxHosts = 254 - firstHost + 1

	// firstHost is the last octet of the first host's address. The low ones
	// are left out so that no host looks like a gateway (.1).
	firstHost = 10

	// bridge is the bridge's name in the switch namespace. Interface names
	// are scoped by namespace and every namespace of a Net is its own, so
	// interface names need no random part; only namespace names are global.
	bridge = "br0"

	// hostLink is the name of a host's interface inside its namespace.
	hostLink = "eth0"
)

// Net is a private IPv4 network of hosts, each a network namespace, joined
// by a bridge in a switch namespace of its own. See the package doc for what
// it guarantees.
//
// A Net is safe for concurrent use; its methods run one at a time.
type Net struct {
	tools  tools
	id     string
	prefix netip.Prefix

	mu     sync.Mutex
	sw     string // switch namespace, "" until created
	hosts  []*Host
	next   int // index of the next host; never reused
	closed bool
}

// Host is one host of a Net: a network namespace with loopback up and one
// interface, eth0, on the Net's subnet. Its fields are set by the Net and
// must not be changed.
type Host struct {
	// Name is the name of the host's network namespace, as `ip netns`
	// knows it, e.g. "baton-4242-a1b2c3-h0". It is unique on the machine.
	Name string

	// IP is the host's address on the Net's subnet: the Net's prefix with
	// last octet 10 for the first host, 11 for the second, and so on.
	IP netip.Addr

	ip command // to run `ip netns exec`
}

// New builds a Net with the given number of hosts, or ends the test: it
// calls Require, so it skips the test (or fails it, see Require) where
// namespaces are unavailable, and fails it if building the Net fails. Close
// is registered with t.Cleanup.
func New(t testing.TB, hosts int) *Net {
	t.Helper()
	Require(t)
	n, err := Open(hosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// Open builds a Net with the given number of hosts, for programs that are
// not tests; the caller must Close it, and should stop the processes it
// started on the hosts first. Where namespaces are unavailable it returns
// Available's error, which wraps ErrUnavailable. If building the Net fails
// halfway, what was built is removed before Open returns the error.
//
// If the program dies without calling Close, the namespaces stay until the
// first Available, Open or Require of a later process removes them, as the
// package doc describes.
func Open(hosts int) (*Net, error) {
	if hosts < 0 || hosts > MaxHosts {
		return nil, fmt.Errorf("netns: open a net of %d hosts: want 0 to %d", hosts, MaxHosts)
	}
	if err := ensureSetup(); err != nil {
		return nil, err
	}
	prefix, err := pickPrefix()
	if err != nil {
		return nil, err
	}
	n := &Net{tools: setup.tools, id: newID(), prefix: prefix}
	err = n.createSwitch()
	for i := 0; err == nil && i < hosts; i++ {
		_, err = n.AddHost()
	}
	if err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

// pickPrefix returns 10.213.X.0/24 with X random among the values for which
// the root namespace has no address on the subnet. The Net would work even
// with one, since its namespaces never see the root's interfaces, but tests
// asserting that the root has no way onto the subnet would fail, and humans
// reading `ip addr` would be confused.
func pickPrefix() (netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("netns: list root namespace addresses: %w", err)
	}
	var taken []netip.Addr
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				taken = append(taken, ip.Unmap())
			}
		}
	}
	for _, x := range rand.Perm(256) {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(x), 0}), 24)
		if !slices.ContainsFunc(taken, p.Contains) {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("netns: the root namespace has an address in every 10.213.X.0/24")
}

// Prefix returns the Net's subnet, 10.213.X.0/24.
func (n *Net) Prefix() netip.Prefix { return n.prefix }

// Hosts returns the current hosts in the order they were added.
func (n *Net) Hosts() []*Host {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.hosts)
}

// createSwitch creates the switch namespace and its bridge.
func (n *Net) createSwitch() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	name := n.id + "-sw"
	if err := n.tools.ip.run("", "netns", "add", name); err != nil {
		return fmt.Errorf("netns: add switch: %w", err)
	}
	n.sw = name
	// The switch only forwards frames; it needs no address of its own.
	err := n.tools.ip.run(batch(
		"link add "+bridge+" type bridge",
		n.tools.noIPv6(bridge),
		"link set "+bridge+" up",
	), "-n", name, "-batch", "-")
	if err != nil {
		return fmt.Errorf("netns: add switch: %w", err)
	}
	return nil
}

// AddHost adds a host to the Net and returns it. The new host is on no side
// of a current partition: it reaches, and is reached by, every host until
// the next Partition or Isolate.
func (n *Net) AddHost() (*Host, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrClosed
	}
	if n.next >= MaxHosts {
		return nil, fmt.Errorf("%w %s: %d hosts created", ErrFull, n.prefix, n.next)
	}
	i := n.next
	n.next++
	a := n.prefix.Addr().As4()
	a[3] = byte(firstHost + i)
	h := &Host{
		Name: n.id + "-h" + strconv.Itoa(i),
		IP:   netip.AddrFrom4(a),
		ip:   n.tools.ip,
	}
	if err := n.tools.ip.run("", "netns", "add", h.Name); err != nil {
		return nil, fmt.Errorf("netns: add host: %w", err)
	}
	if err := n.wireHost(h, i); err != nil {
		// Kept in the list, for Close to retry, only if it cannot be
		// removed now.
		if rmErr := n.tools.removeNamespace(h.Name); rmErr != nil {
			n.hosts = append(n.hosts, h)
			err = errors.Join(err, rmErr)
		}
		return nil, fmt.Errorf("netns: add host %s: %w", h.Name, err)
	}
	n.hosts = append(n.hosts, h)
	return h, nil
}

// wireHost plugs the new host h, number i, into the switch and configures
// its interfaces.
func (n *Net) wireHost(h *Host, i int) error {
	// The veth is created from inside the switch namespace with its peer
	// placed straight into the host's: neither end ever exists in the root
	// namespace, even for a moment.
	port := "h" + strconv.Itoa(i)
	err := n.tools.ip.run(batch(
		"link add "+port+" type veth peer name "+hostLink+" netns "+h.Name,
		n.tools.noIPv6(port),
		"link set "+port+" master "+bridge+" up",
	), "-n", n.sw, "-batch", "-")
	if err != nil {
		return err
	}
	return n.tools.ip.run(batch(
		"link set lo up",
		n.tools.noIPv6(hostLink),
		"address add "+netip.PrefixFrom(h.IP, n.prefix.Bits()).String()+" dev "+hostLink,
		"link set "+hostLink+" up",
	), "-n", h.Name, "-batch", "-")
}

// RemoveHost kills the processes inside h and deletes it, which unplugs its
// cable from the switch. Its address is not given to later hosts.
func (n *Net) RemoveHost(h *Host) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	i := slices.Index(n.hosts, h)
	if i < 0 {
		return fmt.Errorf("%w: %v", ErrUnknownHost, h)
	}
	if err := n.tools.removeNamespace(h.Name); err != nil {
		return fmt.Errorf("netns: remove host %s: %w", h.Name, err)
	}
	n.hosts = slices.Delete(n.hosts, i, i+1)
	return nil
}

// Close kills every process inside the Net's namespaces and deletes the
// namespaces, with their interfaces and the bridge. It is registered with
// t.Cleanup by New; calling it again does nothing and returns nil. Stop
// starting commands on the Net's hosts before calling it: a command still
// between fork and entering its namespace is not found.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	var errs []error
	for _, h := range slices.Backward(n.hosts) {
		if err := n.tools.removeNamespace(h.Name); err != nil {
			errs = append(errs, fmt.Errorf("netns: remove host %s: %w", h.Name, err))
		}
	}
	n.hosts = nil
	if n.sw != "" {
		if err := n.tools.removeNamespace(n.sw); err != nil {
			errs = append(errs, fmt.Errorf("netns: remove switch: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Command returns a command that runs name with args inside the host's
// network namespace, as `ip netns exec NAME name args...`; ip looks name up
// in PATH unless it contains a slash. Since ip execs
// name rather than forking it, the started process is name itself: its pid
// is cmd.Process.Pid, and the context kills it as exec.CommandContext
// describes. cmd.Path is ip's, and cmd.Args starts with ip's path,
// "netns", "exec", h.Name.
//
// The process gets SIGKILL if the thread that started it exits, which in Go
// means when the test process dies (unless the starting goroutine had
// locked its OS thread and exited): set cmd.SysProcAttr to change that.
// Whatever is still running inside the host when the Net is closed, or the
// host removed, is killed then; Wait on the commands you start, or use a
// context that ends with the test, such as t.Context().
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, string(h.ip), append([]string{"netns", "exec", h.Name, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// String returns the host's namespace name and address, for messages.
func (h *Host) String() string {
	if h == nil {
		return "<nil host>"
	}
	return h.Name + " (" + h.IP.String() + ")"
}

// batch joins commands for `ip -batch -`, which runs them in one process
// and stops at the first that fails.
// Empty commands are left out.
func batch(cmds ...string) string {
	var b strings.Builder
	for _, c := range cmds {
		if c != "" {
			b.WriteString(c + "\n")
		}
	}
	return b.String()
}

// noIPv6 returns the ip command that keeps an interface from getting an IPv6
// link-local address when it comes up. Without it each interface runs
// duplicate address detection and sends router solicitations and MLD
// reports onto the switch, and processes could talk over link-local IPv6,
// which Partition's IPv4 rules do not cover. It must run before the
// interface comes up. On a kernel without IPv6 there is nothing to keep
// out, and ip would reject the command, so it is left out.
func (tl tools) noIPv6(dev string) string {
	if !tl.ipv6 {
		return ""
	}
	return "link set " + dev + " addrgenmode none"
}
