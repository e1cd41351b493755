package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// Backends are the names Config.Backend takes.
var Backends = []string{"etcd", "zookeeper", "consul", "raft", "zookeeper-ensemble", "kubernetes", "postgres", "dynamodb", "redis", "redis-sentinel"}

// backend is a real backend for the candidates, with the means to hurt it.
type backend interface {
	// start starts the backend (not the candidates).
	start() error
	// candidate returns what candidate i (0-based) needs to reach the
	// backend: arguments for `baton run` after "run", added environment,
	// and the network namespace host it must run in (nil: this one).
	candidate(i int) (args, env []string, host *netns.Host)
	// cut partitions candidate i from the backend, until heal(i).
	cut(i int) error
	heal(i int) error
	// slow adds latency d to candidate i's link to the backend (0
	// removes it).
	slow(i int, d time.Duration) error
	// down stops the backend, and with wipe deletes its data; up starts
	// it again. Members reports a backend that is the candidates
	// themselves (raft): the harness restarts them instead.
	down(wipe bool) error
	up() error
	members() bool
	// close stops everything the backend started.
	close()
}

// errNotSupported is returned by a fault a backend cannot take.
var errNotSupported = errors.New("not supported by this backend")

func newBackend(name, dir string, n int) (backend, error) {
	switch name {
	case "etcd":
		return &serverBackend{dir: dir, n: n, kind: name,
			run: func(dir string) (string, func(), error) {
				e, err := testserver.NewEtcd(dir)
				if err != nil {
					return "", nil, err
				}
				return e.Endpoint(), e.Close, nil
			},
			urlOf: func(addr string) string { return "etcd://" + addr }}, nil
	case "zookeeper":
		return &serverBackend{dir: dir, n: n, kind: name,
			run: func(dir string) (string, func(), error) {
				z, err := testserver.NewZooKeeper(dir, testserver.ZooKeeperOptions{})
				if err != nil {
					return "", nil, err
				}
				return z.Addr(), z.Close, nil
			},
			urlOf: func(addr string) string { return "zk://" + addr + "/baton-chaos" }}, nil
	case "consul":
		return &serverBackend{dir: dir, n: n, kind: name,
			run: func(dir string) (string, func(), error) {
				c, err := testserver.NewConsul(dir, testserver.ConsulOptions{Persist: true})
				if err != nil {
					return "", nil, err
				}
				return c.Addr(), c.Close, nil
			},
			urlOf: func(addr string) string { return "consul://" + addr + "/baton-chaos" }}, nil
	case "zookeeper-ensemble":
		return newZooKeeperEnsemble(dir, n)
	case "kubernetes":
		return &kubeBackend{dir: dir, n: n}, nil
	case "postgres":
		return &pgBackend{dir: dir, n: n}, nil
	case "dynamodb":
		return &dynamoBackend{dir: dir, n: n}, nil
	case "redis":
		return &redisBackend{dir: dir, n: n}, nil
	case "redis-sentinel":
		return &redisSentinelBackend{dir: dir, n: n}, nil
	case "raft":
		if n < 3 {
			return nil, fmt.Errorf("raft needs at least 3 candidates (they are the group's voters), got %d", n)
		}
		return &raftBackend{dir: dir, n: n}, nil
	}
	return nil, fmt.Errorf("unknown backend %q; want one of %s", name, strings.Join(Backends, ", "))
}

// serverBackend is a client/server backend (etcd, ZooKeeper, Consul): one
// real server on loopback, and a proxy per candidate in front of it, so
// that one candidate alone can be cut off or slowed down.
type serverBackend struct {
	kind  string
	dir   string
	n     int
	run   func(dir string) (addr string, stop func(), err error)
	urlOf func(addr string) string

	mu      sync.Mutex
	stop    func()
	proxies []*testserver.Proxy
}

func (b *serverBackend) data() string { return filepath.Join(b.dir, b.kind) }

func (b *serverBackend) start() error {
	if err := os.MkdirAll(b.data(), 0o755); err != nil {
		return err
	}
	addr, stop, err := b.run(b.data())
	if err != nil {
		return fmt.Errorf("start %s: %w", b.kind, err)
	}
	b.stop = stop
	for range b.n {
		p, err := testserver.NewProxy(addr)
		if err != nil {
			return err
		}
		b.proxies = append(b.proxies, p)
	}
	return nil
}

func (b *serverBackend) candidate(i int) (args, env []string, host *netns.Host) {
	return []string{"--backend", b.urlOf(b.proxies[i].Addr())}, nil, nil
}

func (b *serverBackend) cut(i int) error  { b.proxies[i].Cut(); return nil }
func (b *serverBackend) heal(i int) error { b.proxies[i].Heal(); return nil }

func (b *serverBackend) slow(i int, d time.Duration) error {
	b.proxies[i].SetLatency(d)
	return nil
}

func (b *serverBackend) members() bool { return false }

func (b *serverBackend) down(wipe bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stop != nil {
		b.stop()
		b.stop = nil
	}
	if wipe {
		if err := os.RemoveAll(b.data()); err != nil {
			return err
		}
		return os.MkdirAll(b.data(), 0o755)
	}
	return nil
}

func (b *serverBackend) up() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	addr, stop, err := b.run(b.data())
	if err != nil {
		return fmt.Errorf("restart %s: %w", b.kind, err)
	}
	b.stop = stop
	// A restarted server has a new port; each candidate keeps its proxy.
	for _, p := range b.proxies {
		p.Retarget(addr)
	}
	return nil
}

func (b *serverBackend) close() {
	for _, p := range b.proxies {
		p.Close()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stop != nil {
		b.stop()
		b.stop = nil
	}
}

// raftPort is the group port of every raft member, each on a host of its
// own.
const raftPort = "7390"

// raftSecret is the chaos group's join secret.
const raftSecret = "baton-chaos-join-secret"

// raftBackend is baton's embedded raft: the candidates are the group's
// members, each on a host in a network namespace, so that a member can be
// cut off from the others by nftables rules.
type raftBackend struct {
	dir string
	n   int
	nt  *netns.Net

	mu       sync.Mutex
	isolated map[int]bool
}

func (b *raftBackend) start() error {
	if err := netns.Available(); err != nil {
		return fmt.Errorf("raft needs network namespaces: %w", err)
	}
	nt, err := netns.Open(b.n)
	if err != nil {
		return err
	}
	b.nt = nt
	ca, err := certs.NewCA("baton-chaos CA", 24*time.Hour)
	if err != nil {
		return err
	}
	if err := ca.WriteCert(filepath.Join(b.dir, "ca.pem")); err != nil {
		return err
	}
	for i, h := range nt.Hosts() {
		certPEM, keyPEM, err := ca.Issue(fmt.Sprintf("m%d", i+1), []string{h.IP.String()}, 24*time.Hour)
		if err != nil {
			return err
		}
		if err := certs.WritePair(b.file(i, ".pem"), b.file(i, "-key.pem"), certPEM, keyPEM); err != nil {
			return err
		}
	}
	b.isolated = map[int]bool{}
	return nil
}

func (b *raftBackend) file(i int, suffix string) string {
	return filepath.Join(b.dir, fmt.Sprintf("m%d%s", i+1, suffix))
}

func (b *raftBackend) candidate(i int) (args, env []string, host *netns.Host) {
	hosts := b.nt.Hosts()
	var peers []string
	for _, h := range hosts {
		peers = append(peers, net.JoinHostPort(h.IP.String(), raftPort))
	}
	args = []string{"--backend", "raft://",
		"--bind", net.JoinHostPort(hosts[i].IP.String(), raftPort),
		"--join", "static:" + strings.Join(peers, ","), "--bootstrap-expect", "3",
		"--data-dir", b.file(i, "-data"),
		"--tls-ca", filepath.Join(b.dir, "ca.pem"), "--tls-cert", b.file(i, ".pem"), "--tls-key", b.file(i, "-key.pem")}
	return args, []string{"BATON_SECRET=" + raftSecret}, hosts[i]
}

// partitionLocked applies the cuts in b.isolated: each cut member alone, the others
// together.
func (b *raftBackend) partitionLocked() error {
	if len(b.isolated) == 0 {
		return b.nt.Heal()
	}
	var groups [][]*netns.Host
	var rest []*netns.Host
	for i, h := range b.nt.Hosts() {
		if b.isolated[i] {
			groups = append(groups, []*netns.Host{h})
		} else {
			rest = append(rest, h)
		}
	}
	return b.nt.Partition(append(groups, rest)...)
}

func (b *raftBackend) cut(i int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.isolated[i] = true
	return b.partitionLocked()
}

func (b *raftBackend) heal(i int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.isolated, i)
	return b.partitionLocked()
}

func (b *raftBackend) slow(int, time.Duration) error { return errNotSupported }
func (b *raftBackend) members() bool                 { return true }

// down wipes the members' data when asked; the harness stops and starts the
// members themselves.
func (b *raftBackend) down(wipe bool) error {
	if !wipe {
		return nil
	}
	for i := range b.n {
		if err := os.RemoveAll(b.file(i, "-data")); err != nil {
			return err
		}
	}
	return nil
}

func (b *raftBackend) up() error { return nil }

// wipe removes member i's data: its machine is gone for good.
func (b *raftBackend) wipe(i int) error { return os.RemoveAll(b.file(i, "-data")) }

// addr is member i's group address.
func (b *raftBackend) addr(i int) string {
	return net.JoinHostPort(b.nt.Hosts()[i].IP.String(), raftPort)
}

// recoverMember runs `baton raft recover` on member s's host, naming the
// members at lost as gone, until s accepts (it refuses while it still
// knows a raft leader) or a minute passes.
func (b *raftBackend) recoverMember(baton string, s int, lost ...int) error {
	var addrs []string
	for _, i := range lost {
		addrs = append(addrs, b.addr(i))
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		cmd := b.nt.Hosts()[s].Command(ctx, baton, "raft", "recover", "--member", b.addr(s), "--lost", strings.Join(addrs, ","),
			"--tls-ca", filepath.Join(b.dir, "ca.pem"), "--tls-cert", b.file(s, ".pem"), "--tls-key", b.file(s, "-key.pem"))
		cmd.Env = append(os.Environ(), "BATON_SECRET="+raftSecret)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("baton raft recover --member %s: %w: %s", b.addr(s), err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (b *raftBackend) close() {
	if b.nt != nil {
		_ = b.nt.Close()
	}
}
