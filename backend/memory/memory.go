// Package memory is an in-process baton backend: a Store shared by the
// candidates of one program, with the record-store loop of package backend (RecordBackend) on
// top. Use it in tests, examples and `baton demo --backend memory://`.
//
// It gives exactly the guarantees of backend.RecordBackend, within one process,
// including the lease state of baton.StateTerm. Each Backend from New stands
// for one process's connection to the shared Store, and can be disconnected
// and reconnected to simulate a partition; while disconnected, LoadState and
// StoreState fail like every other store call.
package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// ErrDisconnected is returned by a disconnected Backend's store calls.
var ErrDisconnected = errors.New("memory: disconnected from the store")

// Store holds lease records, and the queues of the processes waiting for
// them (backend.RecordQueue), in memory. The zero value is not usable; call
// NewStore. Safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	recs    map[string]entry
	version uint64 // one counter for all records: versions never repeat
	watch   map[string]map[chan struct{}]struct{}
	// queues holds each lease's waiting processes, head first.
	queues map[string][]string
}

type entry struct {
	rec     backend.LeaseRecord
	version uint64
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{recs: map[string]entry{}, watch: map[string]map[chan struct{}]struct{}{}, queues: map[string][]string{}}
}

var (
	_ backend.RecordKeeper = (*Store)(nil)
	_ backend.RecordKeeper = (*Conn)(nil)
	_ backend.RecordQueue  = (*Store)(nil)
	_ backend.RecordQueue  = (*Conn)(nil)

	_ backend.RecordMultiGetter = (*Store)(nil)
	_ backend.RecordMultiGetter = (*Conn)(nil)
)

// KeepsRecords implements backend.RecordKeeper: a Store lives and dies with the
// candidates that share it, and never loses a record while they use it,
// so its tokens start at 1.
func (s *Store) KeepsRecords() bool { return true }

// Get implements backend.RecordStore. The record's State is a copy of its own.
func (s *Store) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	if err := ctx.Err(); err != nil {
		return backend.LeaseRecord{}, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.recs[name]
	rec := e.rec
	rec.State = bytes.Clone(rec.State) // no caller shares the stored bytes
	return rec, e.version, nil
}

// GetMany implements backend.RecordMultiGetter: the records of names as
// one read of the Store.
func (s *Store) GetMany(ctx context.Context, names []string) ([]backend.LeaseRecord, []uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	recs, versions := make([]backend.LeaseRecord, len(names)), make([]uint64, len(names))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, name := range names {
		e := s.recs[name]
		recs[i], versions[i] = e.rec, e.version
		recs[i].State = bytes.Clone(e.rec.State)
	}
	return recs, versions, nil
}

// CompareAndSwap implements backend.RecordStore. It keeps a copy of rec.State.
func (s *Store) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.recs[name].version; cur != version {
		return 0, fmt.Errorf("%w: record %q is at version %d, not %d", backend.ErrConflict, name, cur, version)
	}
	s.version++
	rec.State = bytes.Clone(rec.State) // nil stays nil, empty stays empty
	s.recs[name] = entry{rec: rec, version: s.version}
	for ch := range s.watch[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return s.version, nil
}

// Notify implements backend.RecordNotifier.
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

// JoinQueue implements backend.RecordQueue.
func (s *Store) JoinQueue(ctx context.Context, name, process string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queues[name] = append(slices.DeleteFunc(s.queues[name], func(p string) bool { return p == process }), process)
	return nil
}

// LeaveQueue implements backend.RecordQueue.
func (s *Store) LeaveQueue(ctx context.Context, name, process string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := slices.DeleteFunc(s.queues[name], func(p string) bool { return p == process }); len(q) > 0 {
		s.queues[name] = q
	} else {
		delete(s.queues, name)
	}
	return nil
}

// QueueHead implements backend.RecordQueue.
func (s *Store) QueueHead(ctx context.Context, name, skip string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.queues[name] {
		if p != skip {
			return p, nil
		}
	}
	return "", nil
}

// DropQueueHead implements backend.RecordQueue.
func (s *Store) DropQueueHead(ctx context.Context, name, process string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	q := s.queues[name]
	ok := len(q) > 0 && q[0] == process
	s.mu.Unlock()
	if ok {
		return s.LeaveQueue(ctx, name, process)
	}
	return nil
}

// Options configures a Backend; see backend.RecordOptions.
type Options = backend.RecordOptions

// Backend is one process's connection to a Store. It embeds the record-store loop (backend.RecordBackend).
type Backend struct {
	*backend.RecordBackend
	conn *Conn
}

var _ baton.Backend = (*Backend)(nil)

// New returns a Backend on s.
func New(s *Store, opts Options) (*Backend, error) {
	if s == nil {
		return nil, &baton.ConfigError{Problems: []string{"memory: Store is nil: create one with memory.NewStore()"}}
	}
	c := s.Connect()
	b, err := backend.NewRecordBackend(c, opts)
	if err != nil {
		return nil, err
	}
	return &Backend{RecordBackend: b, conn: c}, nil
}

// Disconnect makes every store call of this Backend fail, as if its process
// were cut off from the store, until Reconnect.
func (b *Backend) Disconnect() { b.conn.Disconnect() }

// Reconnect undoes Disconnect.
func (b *Backend) Reconnect() { b.conn.Reconnect() }

// Conn is one process's connection to a Store: a backend.RecordStore (and
// backend.RecordNotifier) that can be cut off, for tests and benchmarks that build
// their own backend.RecordBackend. Safe for concurrent use.
type Conn struct {
	s    *Store
	down atomic.Bool
}

// Connect returns a new, connected Conn to s.
func (s *Store) Connect() *Conn { return &Conn{s: s} }

// Disconnect makes every call fail with ErrDisconnected until Reconnect.
func (c *Conn) Disconnect() { c.down.Store(true) }

// Reconnect undoes Disconnect.
func (c *Conn) Reconnect() { c.down.Store(false) }

// Get implements backend.RecordStore.
func (c *Conn) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	if c.down.Load() {
		return backend.LeaseRecord{}, 0, ErrDisconnected
	}
	return c.s.Get(ctx, name)
}

// GetMany implements backend.RecordMultiGetter.
func (c *Conn) GetMany(ctx context.Context, names []string) ([]backend.LeaseRecord, []uint64, error) {
	if c.down.Load() {
		return nil, nil, ErrDisconnected
	}
	return c.s.GetMany(ctx, names)
}

// CompareAndSwap implements backend.RecordStore.
func (c *Conn) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	if c.down.Load() {
		return 0, ErrDisconnected
	}
	return c.s.CompareAndSwap(ctx, name, version, rec)
}

// KeepsRecords implements backend.RecordKeeper, as Store does.
func (c *Conn) KeepsRecords() bool { return true }

// Notify implements backend.RecordNotifier.
func (c *Conn) Notify(ctx context.Context, name string) (<-chan struct{}, error) {
	// A wake-up while disconnected is harmless: the read it triggers fails,
	// which is what a partitioned client sees.
	return c.s.Notify(ctx, name)
}

// JoinQueue implements backend.RecordQueue.
func (c *Conn) JoinQueue(ctx context.Context, name, process string) error {
	if c.down.Load() {
		return ErrDisconnected
	}
	return c.s.JoinQueue(ctx, name, process)
}

// LeaveQueue implements backend.RecordQueue.
func (c *Conn) LeaveQueue(ctx context.Context, name, process string) error {
	if c.down.Load() {
		return ErrDisconnected
	}
	return c.s.LeaveQueue(ctx, name, process)
}

// QueueHead implements backend.RecordQueue.
func (c *Conn) QueueHead(ctx context.Context, name, skip string) (string, error) {
	if c.down.Load() {
		return "", ErrDisconnected
	}
	return c.s.QueueHead(ctx, name, skip)
}

// DropQueueHead implements backend.RecordQueue.
func (c *Conn) DropQueueHead(ctx context.Context, name, process string) error {
	if c.down.Load() {
		return ErrDisconnected
	}
	return c.s.DropQueueHead(ctx, name, process)
}

// Polling returns c without its notifications, so that a backend.RecordBackend over it
// wakes waiters by polling only, as over a store that cannot push changes.
func (c *Conn) Polling() backend.RecordStore { return polling{c} }

// polling hides Conn's Notify method.
type polling struct{ c *Conn }

func (p polling) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	return p.c.Get(ctx, name)
}

func (p polling) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	return p.c.CompareAndSwap(ctx, name, version, rec)
}

func (p polling) KeepsRecords() bool { return true }
