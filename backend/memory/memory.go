// Package memory is an in-process baton backend: a Store shared by the
// candidates of one program, with the lease loop of package backend/cas on
// top. Use it in tests, examples and `baton demo --backend memory://`.
//
// It gives exactly the guarantees of backend/cas, within one process. Each
// Backend from New stands for one process's connection to the shared Store,
// and can be disconnected and reconnected to simulate a partition.
package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/cas"
)

// ErrDisconnected is returned by a disconnected Backend's store calls.
var ErrDisconnected = errors.New("memory: disconnected from the store")

// Store holds lease records in memory. The zero value is not usable; call
// NewStore. Safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	recs    map[string]entry
	version uint64 // one counter for all records: versions never repeat
	watch   map[string]map[chan struct{}]struct{}
}

type entry struct {
	rec     cas.Record
	version uint64
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{recs: map[string]entry{}, watch: map[string]map[chan struct{}]struct{}{}}
}

// Get implements cas.Store.
func (s *Store) Get(ctx context.Context, name string) (cas.Record, uint64, error) {
	if err := ctx.Err(); err != nil {
		return cas.Record{}, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.recs[name]
	return e.rec, e.version, nil
}

// CompareAndSwap implements cas.Store.
func (s *Store) CompareAndSwap(ctx context.Context, name string, version uint64, rec cas.Record) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.recs[name].version; cur != version {
		return 0, fmt.Errorf("%w: record %q is at version %d, not %d", cas.ErrConflict, name, cur, version)
	}
	s.version++
	s.recs[name] = entry{rec: rec, version: s.version}
	for ch := range s.watch[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return s.version, nil
}

// Notify implements cas.Notifier.
func (s *Store) Notify(ctx context.Context, name string) (<-chan struct{}, error) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.watch[name] == nil {
		s.watch[name] = map[chan struct{}]struct{}{}
	}
	s.watch[name][ch] = struct{}{}
	s.mu.Unlock()
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		delete(s.watch[name], ch)
		if len(s.watch[name]) == 0 {
			delete(s.watch, name)
		}
		s.mu.Unlock()
	})
	return ch, nil
}

// Options configures a Backend; see cas.Options.
type Options = cas.Options

// Backend is one process's connection to a Store. It embeds the cas lease loop.
type Backend struct {
	*cas.Backend
	conn *conn
}

var _ baton.Backend = (*Backend)(nil)

// New returns a Backend on s.
func New(s *Store, opts Options) (*Backend, error) {
	if s == nil {
		return nil, &baton.ConfigError{Problems: []string{"memory: Store is nil: create one with memory.NewStore()"}}
	}
	c := &conn{s: s}
	b, err := cas.New(c, opts)
	if err != nil {
		return nil, err
	}
	return &Backend{Backend: b, conn: c}, nil
}

// Disconnect makes every store call of this Backend fail, as if its process
// were cut off from the store, until Reconnect.
func (b *Backend) Disconnect() { b.conn.down.Store(true) }

// Reconnect undoes Disconnect.
func (b *Backend) Reconnect() { b.conn.down.Store(false) }

// conn is a Store view that can be cut off.
type conn struct {
	s    *Store
	down atomic.Bool
}

func (c *conn) Get(ctx context.Context, name string) (cas.Record, uint64, error) {
	if c.down.Load() {
		return cas.Record{}, 0, ErrDisconnected
	}
	return c.s.Get(ctx, name)
}

func (c *conn) CompareAndSwap(ctx context.Context, name string, version uint64, rec cas.Record) (uint64, error) {
	if c.down.Load() {
		return 0, ErrDisconnected
	}
	return c.s.CompareAndSwap(ctx, name, version, rec)
}

func (c *conn) Notify(ctx context.Context, name string) (<-chan struct{}, error) {
	// A wake-up while disconnected is harmless: the read it triggers fails,
	// which is what a partitioned client sees.
	return c.s.Notify(ctx, name)
}
