package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton"
)

// RecordOptions configures a RecordBackend. The zero value means the documented defaults.
type RecordOptions struct {
	// Config holds TTL, RenewInterval and DriftMargin (defaults: 10 s, TTL/3,
	// TTL/10).
	Config

	// PollInterval is how often a waiting candidate re-reads the record. Zero
	// means RenewInterval. With a RecordNotifier a release wakes waiters at once and
	// polling only times takeovers from dead holders.
	PollInterval time.Duration

	// RenewConcurrency bounds how many renewals a renewal round has in
	// flight at once. Zero means 16. A round of n held leases takes about
	// n × (one write's round trip) / RenewConcurrency, so a store whose
	// writes are one request per lease (Kubernetes) needs it raised to
	// renew thousands of leases within RenewInterval.
	RenewConcurrency int

	// Logger receives log lines (group "cas"). Nil means silent.
	Logger *slog.Logger
}

// RecordBackend runs baton leases over a RecordStore. It is safe for concurrent use. One
// RecordBackend stands for one process; it may hold any number of leases.
type RecordBackend struct {
	store RecordStore
	cfg   Config
	poll  time.Duration
	log   *slog.Logger
	// workers is RenewConcurrency, default filled in.
	workers int
	notify  RecordNotifier
	// peek is set when notify's notifications carry the record.
	peek RecordPeeker
	// queue is set when the store keeps a queue of waiting processes
	// (and notifies): releases then name its head. process is this
	// RecordBackend's name in such queues; reserve is how long other
	// processes leave a released lease to the head it names.
	queue   RecordQueue
	process string
	reserve time.Duration
	// keeps is set when the store never loses records (RecordKeeper): tokens of
	// a new record then start at 1, not at an epoch.
	keeps bool
	// epochs follows the epochs of the leases' tokens, so that a record
	// this RecordBackend creates after the store lost one starts above it.
	epochs EpochTracker

	mu     sync.Mutex
	closed bool
	done   chan struct{}       // closed by Close: waiting campaigns give up
	active map[string]*holding // by lease name + "\x00" + candidate ID
	// left records, by the same key, the token of a term of ours that ended
	// without a release, so that we may take that record back at once rather
	// than wait a TTL for our own ghost.
	left map[string]uint64
	// released records, by the same key, when we last released a lease, so
	// that we give waiters one poll interval to take it before we take it
	// back: without that, a holder that resigns and campaigns again would
	// win every time over waiters that learn of the release by polling.
	released map[string]time.Time
	// lines holds, by lease name, this RecordBackend's campaigns for it in
	// turn: one reads and waits on the store, the others wait here, so
	// that a release or a renewal (which wakes waiters too) costs the
	// store one read per process, not one per candidate.
	lines map[string]*waitLine
	wg    sync.WaitGroup

	// renewing holds the terms the renewer keeps fresh; renewerOn is set
	// once the renewer runs, and kick wakes it for a renewal due sooner
	// than it sleeps.
	renewing  map[*holding]struct{}
	renewerOn bool
	kick      chan struct{}

	// seats holds, by lease name, this process's place in the lease's
	// RecordQueue: what it should be and what the store was last told.
	seats map[string]*queueSeat

	// reserved holds, by lease name, the last record seen released to
	// another process (the head of the lease's queue) and when this
	// process first saw it: the reservation runs from then for every
	// campaign of this process, so that campaigns each shorter than it,
	// tried one after another, still take a lease whose head is gone.
	reserved map[string]reservation
}

// reservation is a released record's version and when it was first seen.
type reservation struct {
	v  uint64
	at time.Time
}

var (
	_ baton.Backend       = (*RecordBackend)(nil)
	_ baton.LeadersReader = (*RecordBackend)(nil)
)

// holding is one lease this process campaigns for or holds.
type holding struct {
	name, id string
	term     *BasicTerm
	stop     chan struct{} // closed to stop the renewals
	stopped  chan struct{} // closed when the renewer will no longer start one
	// due is when the renewer renews the term next, for a retry or an
	// adopted write; zero means at its next round. Guarded by
	// RecordBackend.mu.
	due time.Time

	// write admits one write of the record at a time (a renewal, a
	// StoreState, the release); version and rec belong to its holder. So
	// each write starts from the version and state the previous one left,
	// and a renewal never writes back a state older than a StoreState's. It
	// is a channel so that waiting for it honours a context.
	write   chan struct{}
	version uint64
	rec     LeaseRecord
}

// lock waits for h's write turn, or returns ctx's error.
func (h *holding) lock(ctx context.Context) error {
	select {
	case h.write <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *holding) unlock() { <-h.write }

// NewRecordBackend returns a RecordBackend over store.
func NewRecordBackend(store RecordStore, opts RecordOptions) (*RecordBackend, error) {
	cfg, err := opts.Config.WithDefaults()
	if err != nil {
		return nil, err
	}
	if store == nil {
		return nil, &baton.ConfigError{Problems: []string{"cas: the RecordStore is nil"}}
	}
	if opts.PollInterval < 0 {
		return nil, &baton.ConfigError{Problems: []string{fmt.Sprintf("cas: PollInterval (%s) must be positive, or zero for RenewInterval", opts.PollInterval)}}
	}
	if opts.RenewConcurrency < 0 {
		return nil, &baton.ConfigError{Problems: []string{fmt.Sprintf("cas: RenewConcurrency (%d) must be positive, or zero for %d", opts.RenewConcurrency, renewWorkers)}}
	}
	workers := opts.RenewConcurrency
	if workers == 0 {
		workers = renewWorkers
	}
	poll := opts.PollInterval
	if poll == 0 {
		poll = cfg.RenewInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &RecordBackend{done: make(chan struct{}), store: store, cfg: cfg, poll: poll, workers: workers, log: log.WithGroup("cas"), active: map[string]*holding{}, left: map[string]uint64{}, released: map[string]time.Time{},
		lines: map[string]*waitLine{}, renewing: map[*holding]struct{}{}, kick: make(chan struct{}, 1), seats: map[string]*queueSeat{}, reserved: map[string]reservation{},
		process: newProcessID(), reserve: min(cfg.TTL/10, time.Second)}
	b.notify, _ = store.(RecordNotifier)
	if b.notify != nil {
		b.peek, _ = store.(RecordPeeker)
		b.queue, _ = store.(RecordQueue)
	}
	if k, ok := store.(RecordKeeper); ok {
		b.keeps = k.KeepsRecords()
	}
	return b, nil
}

// Config returns the timing the RecordBackend uses, defaults filled in.
func (b *RecordBackend) Config() Config { return b.cfg }

// Process returns the name this RecordBackend waits under in a
// RecordQueue: the host's name, the process ID and a random suffix, so
// that two RecordBackends never share it.
func (b *RecordBackend) Process() string { return b.process }

// newProcessID returns a name for a RecordBackend in RecordQueues: at most
// 64 characters of letters, digits, '.' and '-'.
func newProcessID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '-'
	}, host)
	if len(host) > 40 {
		host = host[:40]
	}
	if host == "" {
		host = "process"
	}
	return fmt.Sprintf("%s-%d-%08x", host, os.Getpid(), rand.Uint32())
}

// Campaign implements baton.Backend.
func (b *RecordBackend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if name == "" || c.ID == "" {
		return nil, fmt.Errorf("cas: lease name and candidate ID must not be empty (name %q, id %q)", name, c.ID)
	}
	key := name + "\x00" + c.ID
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, baton.ErrClosed
	}
	if _, ok := b.active[key]; ok {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: lease %q, candidate %q", baton.ErrAlreadyCampaigning, name, c.ID)
	}
	h := &holding{name: name, id: c.ID, write: make(chan struct{}, 1)}
	b.active[key] = h
	b.mu.Unlock()

	leave, err := b.takeTurn(ctx, name)
	if err != nil {
		b.mu.Lock()
		delete(b.active, key)
		b.mu.Unlock()
		return nil, err
	}
	t, err := b.campaign(ctx, h)
	leave()
	if b.queue != nil {
		// The process stays in the lease's queue while other campaigns of
		// it wait, at the tail once this one won; it leaves with the last.
		b.mu.Lock()
		_, others := b.lines[name]
		b.mu.Unlock()
		b.seat(name, others, others && err == nil)
	}
	if err != nil {
		b.mu.Lock()
		delete(b.active, key)
		b.mu.Unlock()
		return nil, err
	}
	return t, nil
}

// waitLine is the campaigns of one RecordBackend for one lease name: turn
// holds a value while one of them has its turn, and n counts them all.
// Senders blocked on a channel proceed in the order they came, so turns go
// first come, first served.
type waitLine struct {
	turn chan struct{}
	n    int // guarded by RecordBackend.mu
}

// reservedSince returns when this process first saw version v of lease
// name's record, released to another process, recording now if it had not
// (or had seen another version). One entry per lease name is kept: the
// last reservation seen.
func (b *RecordBackend) reservedSince(name string, v uint64, now time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.reserved[name]; ok && r.v == v {
		return r.at
	}
	b.reserved[name] = reservation{v: v, at: now}
	return now
}

// takeTurn waits until no other campaign of b for name reads the store,
// and returns the function that gives the turn to the next one.
func (b *RecordBackend) takeTurn(ctx context.Context, name string) (leave func(), err error) {
	b.mu.Lock()
	l := b.lines[name]
	if l == nil {
		l = &waitLine{turn: make(chan struct{}, 1)}
		b.lines[name] = l
	}
	l.n++
	b.mu.Unlock()
	out := func() {
		b.mu.Lock()
		if l.n--; l.n == 0 {
			delete(b.lines, name)
		}
		b.mu.Unlock()
	}
	select {
	case l.turn <- struct{}{}:
		return func() { <-l.turn; out() }, nil
	case <-ctx.Done():
		out()
		return nil, ctx.Err()
	case <-b.done:
		out()
		return nil, baton.ErrClosed
	}
}

func (b *RecordBackend) campaign(ctx context.Context, h *holding) (baton.Term, error) {
	var (
		wake <-chan struct{}
		// peek is b.peek once notifications run for this campaign.
		peek RecordPeeker
	)
	if b.notify != nil {
		nctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if ch, err := b.notify.Notify(nctx, h.name); err == nil {
			wake, peek = ch, b.peek
		} else {
			b.log.Debug("notifications unavailable; polling", "lease", h.name, "err", err)
		}
	}
	var (
		seen   bool
		seenV  uint64
		seenAt time.Time
		// reservedV is the released record, naming another process as the
		// next holder, that this process first saw at reservedAt.
		reservedV  uint64
		reservedAt time.Time
		// woken is set when a notification woke the campaign: with a
		// RecordPeeker it carried the record, and no read is needed.
		woken bool
	)
	for {
		var (
			rec    LeaseRecord
			v      uint64
			peeked bool
		)
		if woken && peek != nil {
			rec, v, peeked = peek.Peek(h.name)
		}
		if !peeked {
			var err error
			rec, v, err = b.store.Get(ctx, h.name)
			if err != nil {
				return nil, b.unavailable(ctx, "read lease "+h.name, err)
			}
		}
		woken = false
		now := time.Now()
		wait := b.poll
		switch {
		case rec.Holder == "" || b.leftBehind(h, rec):
			// Free, or left by an earlier term of this very RecordBackend that ended
			// without a release: nobody acts on it, take it now. (A record that
			// merely carries our ID could be another process misconfigured
			// with the same ID; that one waits a TTL like any other.)
			mine := rec.Holder == "" && rec.Next == b.process && b.queue != nil
			if rec.Holder == "" && rec.Next != "" && !mine && b.queue != nil {
				// Released to the head of the lease's queue: leave it to
				// that process for the reservation, counted from when this
				// one first saw the release.
				if reservedV != v {
					reservedV, reservedAt = v, b.reservedSince(h.name, v, now)
				}
				if left := b.reserve - now.Sub(reservedAt); left > 0 {
					b.seat(h.name, true, false)
					wait = left
					break
				}
			}
			if d := b.yieldLeft(h); d > 0 && rec.Holder == "" && !mine {
				wait = d
				break
			}
			if t, err := b.acquire(ctx, h, v, rec); t != nil || err != nil {
				return t, err
			}
			if mine {
				// Handed to this process, but another took it (the
				// reservation had passed there, or a client that knows no
				// queue): queue again, at the tail, in case it dropped us.
				b.seat(h.name, true, true)
			}
			seen = false
			if peek == nil {
				continue
			}
			// Another writer won: its write reaches us as a notification,
			// so wait for that (or the poll) rather than read at once.
		case !seen || v != seenV:
			seen, seenV, seenAt = true, v, now
			b.seat(h.name, true, false)
		default:
			ttl := max(rec.TTL, b.cfg.TTL)
			left := ttl - now.Sub(seenAt)
			if left <= 0 {
				b.log.Info("taking over a lease unrenewed for a full TTL", "lease", h.name, "from", rec.Holder, "ttl", ttl)
				if t, err := b.acquire(ctx, h, v, rec); t != nil || err != nil {
					return t, err
				}
				seen = false
				if peek == nil {
					continue
				}
			}
		}
		if seen {
			wait = min(wait, max(rec.TTL, b.cfg.TTL)-now.Sub(seenAt))
		}
		timer := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-b.done:
			timer.Stop()
			return nil, baton.ErrClosed
		case <-wake:
			woken = true
		case <-timer.C:
		}
		timer.Stop()
	}
}

// acquire tries to swap in a record naming h's candidate, with the state of
// old, the record at version v. It returns (nil, nil) when another writer won
// the race, so the caller reads again.
func (b *RecordBackend) acquire(ctx context.Context, h *holding, v uint64, old LeaseRecord) (baton.Term, error) {
	rec := LeaseRecord{Holder: h.id, Token: old.Token + 1, TTL: b.cfg.TTL, Since: time.Now(), State: old.State}
	if b.queue != nil {
		rec.Process = b.process
	}
	if !b.keeps && (v == 0 || old.Token>>32 == 0) {
		// A new record, or one that another kind of client created without
		// an epoch (client-go's elector creates Leases): the store may
		// have lost an older record, whose tokens this one must outrank.
		// The counter goes on from the record's, so that it keeps rising
		// for the other clients too.
		rec.Token = max(rec.Token, EpochToken(b.epochs.Next(h.name, rec.Since), old.Token&math.MaxUint32+1))
	}
	start := time.Now()
	nv, err := b.store.CompareAndSwap(ctx, h.name, v, rec)
	if errors.Is(err, ErrConflict) {
		return nil, nil
	}
	if err != nil {
		// The write may have landed although its reply was lost: look.
		got, gv, gerr := b.store.Get(ctx, h.name)
		if gerr != nil || got.Holder != rec.Holder || got.Token != rec.Token {
			if gerr != nil {
				b.markLeft(h, rec.Token) // it may have landed after all
			}
			return nil, b.unavailable(ctx, "acquire lease "+h.name, err)
		}
		// It did land, at or after start: the deadline from start is safe.
		nv = gv
	}
	h.version, h.rec = nv, rec
	h.stop, h.stopped = make(chan struct{}), make(chan struct{})
	t := NewBasicTerm(h.name, rec.Token, b.cfg.SafeUntil(start, b.cfg.TTL), func(ctx context.Context) error {
		return b.release(ctx, h)
	})
	b.mu.Lock()
	if b.closed {
		// Close already took its snapshot of held leases: give this one back.
		b.mu.Unlock()
		close(h.stop)
		close(h.stopped)
		t.End(fmt.Errorf("%w: lease %q", baton.ErrClosed, h.name))
		_, _ = b.store.CompareAndSwap(context.WithoutCancel(ctx), h.name, nv, LeaseRecord{Token: rec.Token, TTL: rec.TTL, State: rec.State})
		return nil, baton.ErrClosed
	}
	h.term = t
	delete(b.left, h.name+"\x00"+h.id)
	delete(b.released, h.name+"\x00"+h.id)
	// Started under b.mu so that Close, which sets closed under b.mu before
	// it waits, never misses a renewer.
	b.renewing[h] = struct{}{}
	if !b.renewerOn {
		b.renewerOn = true
		b.wg.Go(b.renewer)
	}
	// Close waits for the term's end to be handled, as it waits for the
	// renewer.
	b.wg.Add(1)
	t.afterEnd(func() {
		defer b.wg.Done()
		b.termEnded(h)
	})
	b.mu.Unlock()
	b.log.Debug("acquired", "lease", h.name, "token", rec.Token)
	switch {
	case b.queue == nil:
	case old.Holder == "" && old.Next != "" && old.Next != b.process:
		// The release named another process, which let its reservation
		// pass: it is likely gone, so take it off the queue's head.
		b.inBackground(h.name, "drop a queue head that let its reservation pass", func(ctx context.Context) error {
			return b.queue.DropQueueHead(ctx, h.name, old.Next)
		})
	case old.Holder != "" && old.Process != "" && old.Process != b.process:
		// Taken over from a holder that stopped renewing: its process
		// (crashed, likely) would otherwise stay in the queue, where its
		// candidates waited for their turns, and cost a reservation when
		// it came to the head.
		b.inBackground(h.name, "take a holder that stopped renewing out of the queue", func(ctx context.Context) error {
			return b.queue.LeaveQueue(ctx, h.name, old.Process)
		})
	}
	if !b.keeps {
		if prev, e := b.epochs.Saw(h.name, rec.Token>>32), rec.Token>>32; prev != 0 && e != prev {
			b.log.Warn("the lease's token epoch changed: the store lost the lease's record and it was created anew",
				"lease", h.name, "old_epoch", FormatEpoch(prev), "new_epoch", FormatEpoch(e), "token", rec.Token)
		}
	}
	return &recordTerm{BasicTerm: t, b: b, h: h}, nil
}

func (b *RecordBackend) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %w", baton.ErrBackendUnavailable, what, err)
}

// renewWorkers is RenewConcurrency's default: enough to keep a store with
// network round trips busy, few enough not to swamp it.
const renewWorkers = 16

// renewer keeps every held term's record fresh, for all of them: one
// goroutine and one timer per RecordBackend, however many leases it holds,
// rather than a timer per lease. Every RenewInterval it runs a round that
// renews each term once; a term acquired between rounds is first renewed
// at the next one, earlier than its own interval would have it, which only
// moves its safe-until sooner forward. A renewal that failed is retried
// RenewInterval/4 later, and one that adopted a lost-reply write at once,
// outside the rounds.
func (b *RecordBackend) renewer() {
	round := time.Now().Add(b.cfg.RenewInterval)
	timer := time.NewTimer(b.cfg.RenewInterval)
	defer timer.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-timer.C:
		case <-b.kick:
			timer.Stop()
		}
		now := time.Now()
		full := !now.Before(round)
		if full {
			for !round.After(now) {
				round = round.Add(b.cfg.RenewInterval)
			}
		}
		var batch []*holding
		next := round
		b.mu.Lock()
		for h := range b.renewing {
			switch {
			case !h.due.IsZero() && !h.due.After(now), h.due.IsZero() && full:
				h.due = time.Time{}
				batch = append(batch, h)
			case !h.due.IsZero() && h.due.Before(next):
				next = h.due
			}
		}
		b.mu.Unlock()
		began := time.Now()
		b.renewAll(batch)
		if took := time.Since(began); full && took > b.cfg.RenewInterval {
			// Renewals fall behind: each term is renewed less often than
			// every RenewInterval, and terms end at their safe-until (never
			// held on past it) once a round takes longer than what is left
			// of TTL after a renewal. Say so every round it happens.
			b.log.Warn("renewals are not keeping up: a round took longer than the renew interval; terms end at their safe-until when rounds take longer than the TTL allows: hold fewer leases per process, raise the TTL, or raise RenewConcurrency if the store can take more writes at once",
				"leases", len(batch), "round", took, "renew_interval", b.cfg.RenewInterval, "concurrency", b.workers)
		}
		b.mu.Lock()
		for _, h := range batch {
			if !h.due.IsZero() && h.due.Before(next) {
				next = h.due
			}
		}
		b.mu.Unlock()
		timer.Reset(max(time.Until(next), 0))
	}
}

// renewAll renews each term of batch once, b.workers at a time, the
// nearest safe-until first: when the store or the machine is slow, the
// terms closest to their end are the first to move it.
func (b *RecordBackend) renewAll(batch []*holding) {
	if len(batch) == 0 {
		return
	}
	until := make(map[*holding]time.Time, len(batch))
	for _, h := range batch {
		until[h] = h.term.SafeUntil()
	}
	slices.SortFunc(batch, func(x, y *holding) int { return until[x].Compare(until[y]) })
	// A renewal that cannot finish before safe-until is useless: bound
	// the round's, and their waits for a StoreState to finish with the
	// record, by the latest safe-until among them (one deadline for the
	// round, not a timer per renewal). One that lands after its own term's
	// safe-until extends nothing: the term has ended.
	ctx, cancel := context.WithDeadline(context.Background(), until[batch[len(batch)-1]])
	defer cancel()
	work := make(chan *holding)
	var wg sync.WaitGroup
	for range min(len(batch), b.workers) {
		wg.Go(func() {
			for h := range work {
				b.renewTerm(ctx, h)
			}
		})
	}
	for _, h := range batch {
		work <- h
	}
	close(work)
	wg.Wait()
}

// renewTerm renews h's record once, unless its term ended or its renewals
// were stopped, and sets when to renew it outside the rounds.
func (b *RecordBackend) renewTerm(ctx context.Context, h *holding) {
	var next time.Duration
	if h.lock(ctx) != nil {
		// The round's deadline, every safe-until of it, passed while a
		// StoreState wrote: the term is ending by itself.
		next = b.cfg.RenewInterval / 4
	} else {
		select {
		case <-h.stop:
			next = -1
		default:
			next = b.renewOnce(ctx, h)
		}
		h.unlock()
	}
	if next < 0 || next == b.cfg.RenewInterval {
		return
	}
	b.mu.Lock()
	h.due = time.Now().Add(next)
	b.mu.Unlock()
	if next == 0 {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

// termEnded runs once h's term has ended (Resign, Close, a loss or its
// safe-until passing; a release, which stops the renewals, always follows
// the term's end): it takes h off the renewer's list and lets its candidate
// campaign again.
func (b *RecordBackend) termEnded(h *holding) {
	if errors.Is(h.term.Err(), baton.ErrExpired) {
		b.markLeft(h, h.term.Token())
	}
	if b.queue != nil && (errors.Is(h.term.Err(), baton.ErrExpired) || errors.Is(h.term.Err(), baton.ErrLeaseLost)) {
		// Whoever took the lease over may have taken this process out of
		// its queue, as one that stopped renewing: join again when a
		// campaign next waits.
		b.mu.Lock()
		if s := b.seats[h.name]; s != nil {
			s.in = false
		}
		b.mu.Unlock()
	}
	b.mu.Lock()
	delete(b.renewing, h)
	b.mu.Unlock()
	b.forget(h)
	close(h.stopped)
}

// renewOnce rewrites h's record once, within ctx, and returns when to renew
// next, or -1 when the lease is lost. Called with h's write lock held.
func (b *RecordBackend) renewOnce(ctx context.Context, h *holding) time.Duration {
	if h.term.Err() != nil {
		// It ended while we waited for the lock (a StoreState found the
		// record taken, say): the renewer's select tells why.
		return b.cfg.RenewInterval
	}
	start := time.Now()
	nv, err := b.store.CompareAndSwap(ctx, h.name, h.version, h.rec)
	switch {
	case err == nil:
		h.version = nv
		h.term.Extend(b.cfg.SafeUntil(start, b.cfg.TTL))
		return b.cfg.RenewInterval
	case errors.Is(err, ErrConflict):
		got, gv, gerr := b.store.Get(ctx, h.name)
		switch {
		case gerr != nil:
			h.term.RenewFailed(gerr)
			return b.cfg.RenewInterval / 4
		case got.Holder == h.id && got.Token == h.rec.Token:
			// An earlier write of ours (a renewal, or a StoreState) landed
			// though its reply was lost. Adopt its version and its state,
			// which is the store's now, and renew again at once, so the
			// deadline moves from a write whose start we know.
			b.log.Debug("adopted a write whose reply was lost", "lease", h.name, "token", h.rec.Token)
			h.version, h.rec.State = gv, got.State
			return 0
		default:
			h.term.End(fmt.Errorf("%w: lease %q is now held by %q with token %d", baton.ErrLeaseLost, h.name, got.Holder, got.Token))
			return -1
		}
	default:
		h.term.RenewFailed(err)
		b.log.Warn("renewal failed; retrying", "lease", h.name, "token", h.rec.Token, "err", err, "safe_until_in", time.Until(h.term.SafeUntil()))
		return b.cfg.RenewInterval / 4
	}
}

// yieldLeft is how much longer h's candidate should leave a lease it just
// released to the waiters.
func (b *RecordBackend) yieldLeft(h *holding) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	at, ok := b.released[h.name+"\x00"+h.id]
	if !ok {
		return 0
	}
	yield := b.poll
	if b.notify != nil {
		// Waiters hear of the release at once; a round trip is all they need.
		yield = min(yield, 100*time.Millisecond)
	}
	left := yield - time.Since(at)
	if left <= 0 {
		delete(b.released, h.name+"\x00"+h.id)
	}
	return left
}

func (b *RecordBackend) leftBehind(h *holding, rec LeaseRecord) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	tok, ok := b.left[h.name+"\x00"+h.id]
	return ok && rec.Holder == h.id && rec.Token == tok
}

func (b *RecordBackend) markLeft(h *holding, token uint64) {
	b.mu.Lock()
	b.left[h.name+"\x00"+h.id] = token
	b.mu.Unlock()
}

// forget drops h from the active set so the candidate may campaign again.
func (b *RecordBackend) forget(h *holding) {
	b.mu.Lock()
	if b.active[h.name+"\x00"+h.id] == h {
		delete(b.active, h.name+"\x00"+h.id)
	}
	b.mu.Unlock()
}

// release stops the renewer and clears the holder, keeping the token.
func (b *RecordBackend) release(ctx context.Context, h *holding) error {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	select {
	case <-h.stopped:
	case <-ctx.Done():
		// The renewer is stuck in a store call; it stops when that returns
		// (bounded by safe-until) and the record then expires unrenewed.
		return fmt.Errorf("cas: release lease %q: %w", h.name, ctx.Err())
	}
	if err := h.lock(ctx); err != nil {
		// A StoreState is stuck in a store call; as above.
		return fmt.Errorf("cas: release lease %q: %w", h.name, err)
	}
	defer h.unlock()
	free := LeaseRecord{Token: h.rec.Token, TTL: h.rec.TTL, State: h.rec.State}
	if b.queue != nil {
		// Hand the lease to the process that has waited longest, never to
		// this one: its candidates wait in line here and take the lease
		// when no other process waits for it.
		head, err := b.queue.QueueHead(ctx, h.name, b.process)
		if err != nil {
			b.log.Debug("could not read the lease's queue; releasing to all waiters", "lease", h.name, "err", err)
		}
		free.Next = head
	}
	for {
		_, err := b.store.CompareAndSwap(ctx, h.name, h.version, free)
		if err == nil || !errors.Is(err, ErrConflict) {
			if err != nil {
				b.markLeft(h, h.rec.Token) // it may have landed after all
				return fmt.Errorf("cas: release lease %q: %w", h.name, err)
			}
			b.mu.Lock()
			b.released[h.name+"\x00"+h.id] = time.Now()
			b.mu.Unlock()
			return nil
		}
		got, gv, gerr := b.store.Get(ctx, h.name)
		if gerr != nil {
			return fmt.Errorf("cas: release lease %q: %w", h.name, gerr)
		}
		if got.Holder != h.id || got.Token != h.rec.Token {
			return nil // somebody else's now: nothing of ours to release
		}
		// A lost-reply write of ours: release on top of it, keeping the
		// state it left.
		h.version, h.rec.State, free.State = gv, got.State, got.State
	}
}

// Leader implements baton.Backend. It reports what the store says, which may
// name a holder that died: the record changes only when a campaigning
// candidate takes it over, a TTL after the holder's last renewal at the
// earliest, and never while nobody campaigns.
func (b *RecordBackend) Leader(ctx context.Context, name string) (baton.Record, error) {
	rec, _, err := b.store.Get(ctx, name)
	if err != nil {
		return baton.Record{}, b.unavailable(ctx, "read lease "+name, err)
	}
	return leaderOf(name, rec)
}

// leaderOf is what Leader says of lease name whose record is rec.
func leaderOf(name string, rec LeaseRecord) (baton.Record, error) {
	if rec.Holder == "" {
		return baton.Record{}, fmt.Errorf("%w for lease %q", baton.ErrNoLeader, name)
	}
	return baton.Record{Lease: name, Holder: rec.Holder, Token: rec.Token, Since: rec.Since}, nil
}

// Leaders implements baton.LeadersReader: one GetMany for all of names
// when the RecordStore has it (RecordMultiGetter), else a Get per name,
// one after another.
func (b *RecordBackend) Leaders(ctx context.Context, names []string) ([]baton.Record, []error) {
	recs, errs := make([]baton.Record, len(names)), make([]error, len(names))
	got := make([]LeaseRecord, len(names))
	if mg, ok := b.store.(RecordMultiGetter); ok && len(names) > 0 {
		many, _, err := mg.GetMany(ctx, names)
		if err == nil && len(many) != len(names) {
			err = fmt.Errorf("%T.GetMany returned %d records for %d names", b.store, len(many), len(names))
		}
		if err != nil {
			err = b.unavailable(ctx, fmt.Sprintf("read %d leases", len(names)), err)
			for i := range errs {
				errs[i] = err
			}
			return recs, errs
		}
		got = many
	} else {
		for i, name := range names {
			if got[i], _, errs[i] = b.store.Get(ctx, name); errs[i] != nil {
				errs[i] = b.unavailable(ctx, "read lease "+name, errs[i])
			}
		}
	}
	for i, rec := range got {
		if errs[i] == nil {
			recs[i], errs[i] = leaderOf(names[i], rec)
		}
	}
	return recs, errs
}

// Close ends every term this RecordBackend holds (Err wraps baton.ErrClosed),
// releases their leases so standbys take over at once, and waits for its
// goroutines. The RecordStore is the caller's and is not closed.
func (b *RecordBackend) Close(ctx context.Context) error {
	b.mu.Lock()
	if !b.closed {
		close(b.done)
	}
	b.closed = true
	var held []*holding
	for _, h := range b.active {
		if h.term != nil {
			held = append(held, h)
		}
	}
	b.mu.Unlock()
	var errs []error
	for _, h := range held {
		if h.term.End(fmt.Errorf("%w: lease %q released on close", baton.ErrClosed, h.name)) {
			errs = append(errs, b.release(ctx, h))
		}
	}
	b.wg.Wait()
	b.leaveQueues(ctx)
	return errors.Join(errs...)
}

// queueSeat is a process's place in one lease's RecordQueue: want is
// whether it should be in the queue, back counts the requests to go back
// to its tail; in and inBack are what the store was last told. Guarded by
// RecordBackend.mu.
type queueSeat struct {
	want, in     bool
	back, inBack uint64
	// syncing is set while a goroutine tells the store.
	syncing bool
	// retryAt is when to tell the store again after a call failed (a
	// Role that does not allow the queue, say): not at every renewal the
	// waiting campaign sees. warned is set once a failure was logged at
	// warning level.
	retryAt time.Time
	warned  bool
}

// queueRetry is how long a process waits, in TTLs, before it tries its
// queue again after a call to it failed.
const queueRetry = 6

// seat sets whether this process should be in name's queue, and with
// back set, that it go to the tail again; a goroutine tells the store,
// so that no campaign or term waits for it.
func (b *RecordBackend) seat(name string, want, back bool) {
	if b.queue == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.seats[name]
	if s == nil {
		if !want {
			return
		}
		s = &queueSeat{}
		b.seats[name] = s
	}
	s.want = want
	if back {
		s.back++
	}
	if s.syncing || b.closed || s.settled() || time.Now().Before(s.retryAt) {
		return
	}
	s.syncing = true
	b.wg.Go(func() { b.syncSeat(name, s) })
}

// settled reports whether the store was told what s wants.
func (s *queueSeat) settled() bool {
	return s.want == s.in && (!s.want || s.back == s.inBack)
}

// syncSeat tells the store what s wants until it has told it all. A store
// call that fails is logged (the first at warning level) and tried again
// at the first change of the seat queueRetry TTLs later; Close takes the
// process out of every queue.
func (b *RecordBackend) syncSeat(name string, s *queueSeat) {
	for {
		b.mu.Lock()
		if s.settled() {
			s.syncing = false
			if !s.want && b.seats[name] == s {
				delete(b.seats, name)
			}
			b.mu.Unlock()
			return
		}
		want, back := s.want, s.back
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.TTL)
		var err error
		if want {
			err = b.queue.JoinQueue(ctx, name, b.process)
		} else {
			err = b.queue.LeaveQueue(ctx, name, b.process)
		}
		cancel()
		b.mu.Lock()
		if err != nil {
			s.syncing = false
			s.retryAt = time.Now().Add(queueRetry * b.cfg.TTL)
			warn := !s.warned
			s.warned = true
			b.mu.Unlock()
			level := slog.LevelDebug
			if warn {
				level = slog.LevelWarn
			}
			b.log.Log(context.Background(), level, "could not update the queue of the processes waiting for the lease; this process competes with the others at each release until it can", "lease", name, "join", want, "retry_in", queueRetry*b.cfg.TTL, "err", err)
			return
		}
		s.in, s.inBack = want, back
		b.mu.Unlock()
	}
}

// inBackground runs the queue update f (what it does: what) in a goroutine
// that Close waits for, within a TTL; a failure is logged only, since the
// queue serves liveness alone.
func (b *RecordBackend) inBackground(name, what string, f func(ctx context.Context) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.TTL)
		defer cancel()
		if err := f(ctx); err != nil {
			b.log.Debug("could not "+what, "lease", name, "err", err)
		}
	})
}

// leaveQueues takes this process out of every queue it may be in; Close
// calls it once no goroutine of b tells the store anything more. A queue
// it could not leave keeps a stale entry, which costs one reservation
// when it comes to the head and is then dropped.
func (b *RecordBackend) leaveQueues(ctx context.Context) {
	b.mu.Lock()
	var names []string
	for name, s := range b.seats {
		if s.in || s.want {
			names = append(names, name)
		}
	}
	b.seats = map[string]*queueSeat{}
	b.mu.Unlock()
	for _, name := range names {
		if err := b.queue.LeaveQueue(ctx, name, b.process); err != nil {
			b.log.Debug("could not leave the lease's queue on close", "lease", name, "err", err)
		}
	}
}
