package harness

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// dynamoTable is the table the candidates share; dynamoKey is its
// partition key, backend/dynamodb's KeyAttribute.
const (
	dynamoTable = "baton-chaos"
	dynamoKey   = "pk"
)

// dynamoBackend is dynalite, a DynamoDB emulator that keeps its tables in
// LevelDB (testserver.NewDynalite), and a proxy per candidate in front of
// it, so that one candidate alone can be cut off or slowed down. A restart
// keeps the table; a wipe brings the emulator back empty and makes the
// table again, its items and their tokens gone, as a table dropped and
// made again would be.
type dynamoBackend struct {
	dir string
	n   int

	d       *testserver.DynaliteProc
	proxies []*testserver.Proxy

	mu   sync.Mutex
	wipe bool // the emulator is down, and comes back wiped
}

func (b *dynamoBackend) start() error {
	data := filepath.Join(b.dir, "dynamodb")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	d, err := testserver.NewDynalite(data)
	if err != nil {
		return fmt.Errorf("start dynalite: %w", err)
	}
	b.d = d
	if err := d.CreateTable(dynamoTable, dynamoKey); err != nil {
		return err
	}
	for range b.n {
		p, err := testserver.NewProxy(d.Addr)
		if err != nil {
			return err
		}
		b.proxies = append(b.proxies, p)
	}
	return nil
}

// candidate gives candidate i the table through its proxy, and made-up
// static credentials (dynalite checks none) with nothing else to resolve.
func (b *dynamoBackend) candidate(i int) (args, env []string, host *netns.Host) {
	u := "dynamodb://" + dynamoTable + "?region=us-east-1&endpoint=" + url.QueryEscape("http://"+b.proxies[i].Addr())
	none := filepath.Join(b.dir, "no-aws-config")
	return []string{"--backend", u}, []string{"AWS_ACCESS_KEY_ID=AKIDBATONCHAOS", "AWS_SECRET_ACCESS_KEY=secret",
		"AWS_CONFIG_FILE=" + none, "AWS_SHARED_CREDENTIALS_FILE=" + none, "AWS_EC2_METADATA_DISABLED=true"}, nil
}

func (b *dynamoBackend) cut(i int) error  { b.proxies[i].Cut(); return nil }
func (b *dynamoBackend) heal(i int) error { b.proxies[i].Heal(); return nil }

func (b *dynamoBackend) slow(i int, d time.Duration) error {
	b.proxies[i].SetLatency(d)
	return nil
}

func (b *dynamoBackend) members() bool { return false }

// down stops the emulator; with wipe, up brings it back empty.
func (b *dynamoBackend) down(wipe bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.d.Stop()
	b.wipe = wipe
	return nil
}

// up starts the emulator again on the same port, and makes the table
// again after a wipe.
func (b *dynamoBackend) up() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.d.Restart(b.wipe); err != nil {
		return fmt.Errorf("restart dynalite: %w", err)
	}
	b.wipe = false
	return b.d.CreateTable(dynamoTable, dynamoKey)
}

// close stops the proxies and the emulator.
func (b *dynamoBackend) close() {
	for _, p := range b.proxies {
		p.Close()
	}
	if b.d != nil {
		b.d.Stop()
	}
}
