package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// redisBackend is a real redis-server (testserver.Redis) with an AOF
// fsynced on every write, and a proxy per candidate in front of it, so that
// one candidate alone can be cut off or slowed down.
//
// A restart kills the server (SIGKILL) and starts it on its AOF: nothing
// is lost. A wipe deletes the AOF and RDB files first: every lease key,
// token key and the store marker are gone, as after a restart without
// persistence.
type redisBackend struct {
	dir string
	n   int

	srv     *testserver.Redis
	proxies []*testserver.Proxy

	mu   sync.Mutex
	wipe bool
}

func (b *redisBackend) start() error {
	data := filepath.Join(b.dir, "redis")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	srv, err := testserver.NewRedis(data, testserver.RedisOptions{Config: []string{"appendonly yes", "appendfsync always"}})
	if err != nil {
		return fmt.Errorf("start redis: %w", err)
	}
	b.srv = srv
	for range b.n {
		p, err := testserver.NewProxy(srv.Addr())
		if err != nil {
			return err
		}
		b.proxies = append(b.proxies, p)
	}
	return nil
}

func (b *redisBackend) candidate(i int) (args, env []string, host *netns.Host) {
	return []string{"--backend", "redis://" + b.proxies[i].Addr() + "/0"}, nil, nil
}

func (b *redisBackend) cut(i int) error  { b.proxies[i].Cut(); return nil }
func (b *redisBackend) heal(i int) error { b.proxies[i].Heal(); return nil }

func (b *redisBackend) slow(i int, d time.Duration) error {
	b.proxies[i].SetLatency(d)
	return nil
}

func (b *redisBackend) members() bool { return false }

// down kills the server; with wipe, up brings it back without its data.
func (b *redisBackend) down(wipe bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.srv.Kill()
	b.wipe = wipe
	return nil
}

// up starts the server again on the same port and returns once it
// answers.
func (b *redisBackend) up() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.wipe {
		for _, f := range []string{"appendonlydir", "dump.rdb"} {
			if err := os.RemoveAll(filepath.Join(b.srv.Dir(), f)); err != nil {
				return err
			}
		}
	}
	if err := b.srv.Start(); err != nil {
		return fmt.Errorf("restart redis: %w", err)
	}
	b.wipe = false
	return nil
}

// close stops the proxies and the server.
func (b *redisBackend) close() {
	for _, p := range b.proxies {
		p.Close()
	}
	if b.srv != nil {
		b.srv.Close()
	}
}
