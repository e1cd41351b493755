package harness

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// redisSentinelBackend is a Redis primary, its replica and three sentinels
// (real redis-server and redis-sentinel, loopback, no persistence; the
// sentinels judge a server down after 1 s), which
// the candidates reach by a redis+sentinel:// URL, so that every
// acquisition and renewal waits for the replica (baton_replicas defaults
// to 1 there).
//
// The candidates dial whatever address the sentinels name, so no proxy
// stands between a candidate and the servers: a candidate cannot be cut
// off or slowed alone (KindCut and KindSlow are not taken); the faults
// that isolate a holder are the stops (KindStopBaton, KindStopTree,
// KindStall). The backend's own fault is KindFailover.
type redisSentinelBackend struct {
	dir string
	n   int

	mu        sync.Mutex
	servers   [2]*testserver.Redis
	primary   int // index in servers of the primary
	sentinels *testserver.Sentinels
}

// failoverHow is how a KindFailover fault fails the primary over.
type failoverHow int

const (
	// failoverLosing stops the replica (SIGSTOP) and has the primary drop
	// its link, lets the candidates write to the primary alone for a
	// while, then kills the primary (kill -9) and resumes the replica:
	// those writes are lost when Sentinel promotes it.
	failoverLosing failoverHow = iota
	// failoverKill kills the primary (kill -9) with its replica in sync,
	// but for what was in flight.
	failoverKill
	// failoverCommand is SENTINEL FAILOVER: the replica is promoted and
	// the primary, still up, demoted; what it took in between is lost.
	failoverCommand
)

func (h failoverHow) String() string {
	switch h {
	case failoverLosing:
		return "replication cut, then kill -9 of the primary"
	case failoverKill:
		return "kill -9 of the primary"
	}
	return "SENTINEL FAILOVER"
}

// failoverer is a backend that a KindFailover fault can fail over.
type failoverer interface {
	// failover fails the primary over as how says (writing to the primary
	// alone for lose first, for failoverLosing) and returns once the group
	// is whole again: the new primary named by every sentinel, the old
	// one its replica in sync, and every sentinel seeing that replica
	// sound, ready for the next failover.
	failover(how failoverHow, lose time.Duration) error
}

var _ failoverer = (*redisSentinelBackend)(nil)

// redisGroupTimeout bounds each wait for the group to reach a state.
const redisGroupTimeout = 90 * time.Second

func (b *redisSentinelBackend) start() error {
	var err error
	for i := range b.servers {
		dir := filepath.Join(b.dir, fmt.Sprintf("redis-%d", i+1))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		o := testserver.RedisOptions{}
		if i == 1 {
			o.ReplicaOf = b.servers[0].Addr()
		}
		if b.servers[i], err = testserver.NewRedis(dir, o); err != nil {
			return fmt.Errorf("start redis: %w", err)
		}
	}
	if err := waitFor("the replica in sync", func() bool { return replicaInSync(b.servers[1], b.servers[0]) }); err != nil {
		return err
	}
	if b.sentinels, err = testserver.NewSentinels(filepath.Join(b.dir, "sentinels"), b.servers[0], testserver.SentinelOptions{}); err != nil {
		return fmt.Errorf("start sentinels: %w", err)
	}
	return b.waitWhole()
}

// waitFor polls cond until it holds, for up to redisGroupTimeout.
func waitFor(what string, cond func() bool) error {
	deadline := time.Now().Add(redisGroupTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-sentinel: %s: not within %s", what, redisGroupTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// replicaInSync reports whether r is primary p's replica with its link up.
func replicaInSync(r, p *testserver.Redis) bool {
	v, _ := r.Do("INFO", "replication")
	s, _ := v.(string)
	_, port, _ := net.SplitHostPort(p.Addr())
	return strings.Contains(s, "role:slave") && strings.Contains(s, "master_link_status:up") &&
		strings.Contains(s, "master_port:"+port+"\r")
}

// fields turns a flat [k1, v1, k2, v2, ...] reply into a map.
func fields(v any) map[string]string {
	a, _ := v.([]any)
	m := map[string]string{}
	for i := 0; i+1 < len(a); i += 2 {
		m[fmt.Sprint(a[i])] = fmt.Sprint(a[i+1])
	}
	return m
}

// waitWhole waits until every sentinel names the same server as the
// primary, that server serves as one, the other is its replica in sync,
// and every sentinel sees that replica sound and knows the other
// sentinels; it records which server is the primary. (Sentinel may fail
// over on its own, e.g. when a busy host keeps the primary from
// answering within down-after: whichever server it chose is the
// primary.)
func (b *redisSentinelBackend) waitWhole() error {
	name := b.sentinels.MasterName
	primary := -1
	err := waitFor("every sentinel to see one primary and its replica sound", func() bool {
		addr := ""
		for _, sp := range b.sentinels.Procs {
			v, err := sp.Do("SENTINEL", "get-master-addr-by-name", name)
			a, ok := v.([]any)
			if err != nil || !ok || len(a) != 2 {
				return false
			}
			got := net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1]))
			if addr != "" && got != addr {
				return false
			}
			addr = got
		}
		pi := slices.IndexFunc(b.servers[:], func(s *testserver.Redis) bool { return s.Addr() == addr })
		if pi < 0 {
			return false
		}
		p, r := b.servers[pi], b.servers[1-pi]
		v, _ := p.Do("INFO", "replication")
		if s, _ := v.(string); !strings.Contains(s, "role:master") || !replicaInSync(r, p) {
			return false
		}
		for _, sp := range b.sentinels.Procs {
			m, err := sp.Do("SENTINEL", "master", name)
			if f := fields(m); err != nil || f["flags"] != "master" {
				return false
			}
			reps, err := sp.Do("SENTINEL", "replicas", name)
			a, ok := reps.([]any)
			if err != nil || !ok || len(a) != 1 {
				return false
			}
			if f := fields(a[0]); f["flags"] != "slave" || f["master-link-status"] != "ok" || net.JoinHostPort(f["ip"], f["port"]) != r.Addr() {
				return false
			}
			others, err := sp.Do("SENTINEL", "sentinels", name)
			if a, ok := others.([]any); err != nil || !ok || len(a) != len(b.sentinels.Procs)-1 {
				return false
			}
		}
		primary = pi
		return true
	})
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.primary = primary
	b.mu.Unlock()
	return nil
}

func (b *redisSentinelBackend) failover(how failoverHow, lose time.Duration) error {
	// Which server is the primary now (Sentinel may have failed over on
	// its own since the last fault).
	if err := b.waitWhole(); err != nil {
		return err
	}
	b.mu.Lock()
	p, r := b.servers[b.primary], b.servers[1-b.primary]
	b.mu.Unlock()
	name := b.sentinels.MasterName
	switch how {
	case failoverLosing:
		if err := r.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		if _, err := p.Do("CLIENT", "KILL", "TYPE", "replica"); err != nil {
			_ = r.Signal(syscall.SIGCONT)
			return fmt.Errorf("redis-sentinel: cut the replication link: %w", err)
		}
		time.Sleep(lose)
		p.Kill()
		if err := r.Signal(syscall.SIGCONT); err != nil {
			return err
		}
	case failoverKill:
		p.Kill()
	case failoverCommand:
		var last error
		if err := waitFor("SENTINEL FAILOVER accepted", func() bool {
			_, last = b.sentinels.Procs[0].Do("SENTINEL", "FAILOVER", name)
			return last == nil
		}); err != nil {
			return fmt.Errorf("%w (last reply: %v)", err, last)
		}
	}
	if err := waitFor("every sentinel to name the promoted replica", func() bool {
		for _, sp := range b.sentinels.Procs {
			v, err := sp.Do("SENTINEL", "get-master-addr-by-name", name)
			if a, ok := v.([]any); err != nil || !ok || len(a) != 2 || net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1])) != r.Addr() {
				return false
			}
		}
		// Started before the replica left it, the empty old primary
		// would have the replica copy its empty data.
		v, _ := r.Do("INFO", "replication")
		s, _ := v.(string)
		return strings.Contains(s, "role:master")
	}); err != nil {
		return err
	}
	if how != failoverCommand {
		// The operator restarts the old primary, empty (the RDB file a
		// full sync left is deleted: no persistence), as the new one's
		// replica (Sentinel would convert it too, but only at its next
		// look).
		if err := os.Remove(filepath.Join(p.Dir(), "dump.rdb")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := p.Start(); err != nil {
			return fmt.Errorf("restart the old primary: %w", err)
		}
		host, port, _ := net.SplitHostPort(r.Addr())
		if _, err := p.Do("REPLICAOF", host, port); err != nil {
			return fmt.Errorf("make the old primary a replica: %w", err)
		}
	}
	return b.waitWhole()
}

func (b *redisSentinelBackend) candidate(int) (args, env []string, host *netns.Host) {
	return []string{"--backend", "redis+sentinel://" + strings.Join(b.sentinels.Addrs(), ",") + "/" + b.sentinels.MasterName}, nil, nil
}

func (b *redisSentinelBackend) cut(int) error                 { return errNotSupported }
func (b *redisSentinelBackend) heal(int) error                { return errNotSupported }
func (b *redisSentinelBackend) slow(int, time.Duration) error { return errNotSupported }
func (b *redisSentinelBackend) members() bool                 { return false }
func (b *redisSentinelBackend) down(bool) error               { return errNotSupported }
func (b *redisSentinelBackend) up() error                     { return errNotSupported }

// close stops the sentinels and the servers, and keeps their logs in the
// run's directory.
func (b *redisSentinelBackend) close() {
	if b.sentinels != nil {
		b.sentinels.Close()
	}
	for i, s := range b.servers {
		if s != nil {
			s.Close()
			_ = os.WriteFile(filepath.Join(b.dir, fmt.Sprintf("redis-%d.log", i+1)), []byte(s.Log()), 0o644)
		}
	}
}
