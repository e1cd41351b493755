package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// zkEnsembleServers is the size of the zookeeper-ensemble backend's
// ensemble: the smallest that survives the loss of one server.
const zkEnsembleServers = 3

// zkEnsembleBackend is a real ZooKeeper ensemble of three servers, each on
// a host in a network namespace of its own, and a host per candidate on the
// same network. nftables rules between the hosts cut a candidate off from
// the ensemble, or a server off from the other servers and the candidates.
// The candidates run on their hosts because a namespace's address is
// reachable only from inside the network; the fenced store is a Unix
// socket, which they reach all the same.
type zkEnsembleBackend struct {
	dir string
	n   int

	nt  *netns.Net
	ens *testserver.ZooKeeperEnsemble

	mu         sync.Mutex
	cutCands   map[int]bool // candidates cut off, by index
	cutServers map[int]bool // servers cut off, by index
}

// newZooKeeperEnsemble returns a three-server ZooKeeper ensemble backend
// for n candidates.
func newZooKeeperEnsemble(dir string, n int) (backend, error) {
	return &zkEnsembleBackend{dir: dir, n: n, cutCands: map[int]bool{}, cutServers: map[int]bool{}}, nil
}

func (b *zkEnsembleBackend) data() string { return filepath.Join(b.dir, "zookeeper-ensemble") }

func (b *zkEnsembleBackend) start() error {
	if err := netns.Available(); err != nil {
		return fmt.Errorf("zookeeper-ensemble needs network namespaces: %w", err)
	}
	nt, err := netns.Open(zkEnsembleServers + b.n)
	if err != nil {
		return err
	}
	b.nt = nt
	hosts := nt.Hosts()[:zkEnsembleServers]
	ips := make([]string, len(hosts))
	for i, h := range hosts {
		ips[i] = h.IP.String()
	}
	if err := os.MkdirAll(b.data(), 0o755); err != nil {
		return err
	}
	ens, err := testserver.NewZooKeeperEnsembleWith(b.data(), zkEnsembleServers, testserver.ZooKeeperEnsembleOptions{
		Hosts: ips,
		Command: func(i int, name string, arg ...string) *exec.Cmd {
			return hosts[i].Command(context.Background(), name, arg...)
		},
	})
	if err != nil {
		return fmt.Errorf("start zookeeper ensemble: %w", err)
	}
	b.ens = ens
	return nil
}

func (b *zkEnsembleBackend) candidate(i int) (args, env []string, host *netns.Host) {
	url := "zk://" + strings.Join(b.ens.Addrs(), ",") + "/baton-chaos"
	return []string{"--backend", url}, nil, b.nt.Hosts()[zkEnsembleServers+i]
}

// partitionLocked applies the cuts: each cut candidate's and cut server's
// host alone, every other host together. Cuts overlap, so every change
// rebuilds the whole partition in one call.
func (b *zkEnsembleBackend) partitionLocked() error {
	if len(b.cutCands) == 0 && len(b.cutServers) == 0 {
		return b.nt.Heal()
	}
	var groups [][]*netns.Host
	var rest []*netns.Host
	for i, h := range b.nt.Hosts() {
		cut := false
		if i < zkEnsembleServers {
			cut = b.cutServers[i]
		} else {
			cut = b.cutCands[i-zkEnsembleServers]
		}
		if cut {
			groups = append(groups, []*netns.Host{h})
		} else {
			rest = append(rest, h)
		}
	}
	return b.nt.Partition(append(groups, rest)...)
}

// setCut marks index i of set cut or not, and applies the partition.
func (b *zkEnsembleBackend) setCut(set map[int]bool, i int, cut bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cut {
		set[i] = true
	} else {
		delete(set, i)
	}
	return b.partitionLocked()
}

func (b *zkEnsembleBackend) cut(i int) error  { return b.setCut(b.cutCands, i, true) }
func (b *zkEnsembleBackend) heal(i int) error { return b.setCut(b.cutCands, i, false) }

func (b *zkEnsembleBackend) slow(int, time.Duration) error { return errNotSupported }
func (b *zkEnsembleBackend) members() bool                 { return false }

// down kills every server; their data stays for up.
func (b *zkEnsembleBackend) down(wipe bool) error {
	if wipe {
		return errNotSupported
	}
	var wg sync.WaitGroup
	for i := range zkEnsembleServers {
		wg.Go(func() { b.ens.Kill(i) })
	}
	wg.Wait()
	return nil
}

// up restarts every server at once, each on its data, and returns once
// each serves as leader or follower: the ensemble has a quorum again. (One
// at a time would not do: a lone server cannot serve.)
func (b *zkEnsembleBackend) up() error {
	errs := make([]error, zkEnsembleServers)
	var wg sync.WaitGroup
	for i := range zkEnsembleServers {
		wg.Go(func() { errs[i] = b.ens.Restart(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (b *zkEnsembleBackend) servers() int { return zkEnsembleServers }

func (b *zkEnsembleBackend) killServer(i int) error { b.ens.Kill(i); return nil }

// startServer restarts server i on its data, and returns once it serves
// again, having found the quorum's leader and caught up.
func (b *zkEnsembleBackend) startServer(i int) error { return b.ens.Restart(i) }

func (b *zkEnsembleBackend) cutServer(i int) error  { return b.setCut(b.cutServers, i, true) }
func (b *zkEnsembleBackend) healServer(i int) error { return b.setCut(b.cutServers, i, false) }

// close stops the servers, keeps their logs in the run's directory, and
// removes the namespaces.
func (b *zkEnsembleBackend) close() {
	if b.ens != nil {
		b.ens.Close()
		for i := range b.ens.Len() {
			_ = os.WriteFile(filepath.Join(b.dir, fmt.Sprintf("zk-server-%d.log", i+1)), []byte(b.ens.Log(i)), 0o644)
		}
	}
	if b.nt != nil {
		_ = b.nt.Close()
	}
}
