package consul

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// watcher keeps one blocking query open for a Backend: a recursive read of
// the longest common prefix of every key the Backend waits for or holds.
// Each HTTP blocking query occupies a connection to the agent, which allows
// only 200 per client address by default (limits.http_max_conns_per_client),
// so a query per key would not scale to a process with many leases; one
// query costs one connection however many keys it covers, at the price of
// reading every key under the prefix each time one of them changes.
//
// Subscribers see the latest state of their key, and are woken only when it
// changed. Safe for concurrent use.
type watcher struct {
	kv   *api.KV
	ctx  context.Context // the Backend's: ends at Close
	wg   sync.WaitGroup  // the watcher's goroutine; see done
	wait time.Duration   // the blocking query's wait time
	log  *slog.Logger

	mu      sync.Mutex
	closed  bool
	running bool // the loop goroutine is active
	subs    map[*sub]struct{}
	prefix  string                 // of the query in flight, or of the last answer
	index   uint64                 // the last answer's index; 0 before the first
	last    map[string]*api.KVPair // the last answer, by key
	queries uint64                 // queries issued so far
	seq     uint64                 // answers (and failures) delivered so far
	cancel  context.CancelFunc     // of the query in flight
	kicked  bool                   // cancel was called to re-issue the query
	kick    chan struct{}          // wakes the loop from a back-off
}

// sub is one subscriber's view of one key.
type sub struct {
	key string
	ch  chan struct{} // poked, without blocking, when st changes

	// Guarded by watcher.mu.
	since uint64 // watcher.queries when it subscribed: later queries are current
	st    state
	// force makes the next answer reach the subscriber even if its key
	// looks unchanged (see refresh).
	force bool
	// hook, set by onChange, is called with each new state of the key
	// that an answer brings, instead of poking ch: a held lease's term
	// needs no goroutine of its own to wait for it.
	hook func(state)
	// last, if set, reports a state after which the subscriber wants no
	// more (a waiter's predecessor gone): the watcher then drops the
	// subscription itself, before it issues its next query. An agent
	// keeps serving a blocking query that its client abandoned, holding
	// one of the client address's connections (http_max_conns_per_client)
	// until the query would have answered, up to its wait time: a query
	// issued only to be cancelled a moment later, when the subscriber
	// moves on, costs that.
	last func(state) bool
}

// state is what the watcher last learnt about a key.
type state struct {
	// seq orders states; 0 means nothing has been delivered yet.
	seq uint64
	// pair is the key's entry, nil when the key does not exist.
	pair *api.KVPair
	// index is the answer's X-Consul-Index.
	index uint64
	// current reports that the query was issued after the subscriber
	// subscribed (or was rebased), so that it reflects a state no older
	// than that moment.
	current bool
	// err is set when the query failed; pair and index are then unchanged.
	err error
}

func newWatcher(ctx context.Context, kv *api.KV, wait time.Duration, log *slog.Logger) *watcher {
	return &watcher{
		kv:   kv,
		ctx:  ctx,
		wait: wait,
		log:  log,
		subs: map[*sub]struct{}{},
		kick: make(chan struct{}, 1),
	}
}

// subscribe starts watching key. It returns nil after close.
func (w *watcher) subscribe(key string) *sub { return w.subscribeUntil(key, nil) }

// subscribeUntil starts watching key until a state for which last reports
// true (see sub.last); nil means for as long as the subscriber wants. It
// returns nil after close.
func (w *watcher) subscribeUntil(key string, last func(state) bool) *sub {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	s := &sub{key: key, ch: make(chan struct{}, 1), since: w.queries, last: last}
	w.subs[s] = struct{}{}
	switch {
	case !w.running:
		w.running = true
		w.wg.Add(1)
		go w.run()
	case !hasPrefix(key, w.prefix):
		w.restartLocked() // widen the query to cover key
	case w.index > 0:
		// The last answer covers key: a waiter can act on it at once.
		w.seq++
		s.st = state{seq: w.seq, pair: w.last[key], index: w.index}
		s.ch <- struct{}{}
		if last != nil && last(s.st) {
			w.dropLocked(s)
		}
	}
	return s
}

// dropLocked removes s; when nothing is left to watch, the query in flight
// is abandoned and the loop ends.
func (w *watcher) dropLocked(s *sub) {
	if _, ok := w.subs[s]; !ok {
		return
	}
	delete(w.subs, s)
	if len(w.subs) == 0 {
		w.restartLocked()
	}
}

// rebase makes only answers to queries issued from now on current for s:
// a waiter that has just won its key hands its subscription to the term,
// whose judgements must not rest on answers from before it won.
func (w *watcher) rebase(s *sub) {
	w.mu.Lock()
	s.since = w.queries
	s.st.current = false
	w.mu.Unlock()
}

// refresh makes the next answer (or failure) wake s even if s's key is as
// it was in the last state s saw. A waiter calls it before each lock
// attempt on the state it saw: should the attempt fail because the key
// changed, the key may change back to that state before the next answer
// (deleted, locked by someone, deleted again: absent both times), and
// samePair would then swallow the answer, leaving the waiter asleep on a
// free key. Called after the failure instead, it would come too late for
// an answer that arrived while the attempt's reply was on its way.
func (w *watcher) refresh(s *sub) {
	w.mu.Lock()
	s.force = true
	w.mu.Unlock()
}

// unsubscribe stops watching s's key. When nothing is left to watch, the
// query in flight is abandoned and the loop ends.
func (w *watcher) unsubscribe(s *sub) {
	if s == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropLocked(s)
}

// close ends the loop for good; later subscriptions return nil.
func (w *watcher) close() {
	w.mu.Lock()
	w.closed = true
	w.restartLocked()
	w.mu.Unlock()
}

// done waits for the watcher's goroutine, which returns once the context
// given to newWatcher ended.
func (w *watcher) done() { w.wg.Wait() }

func (w *watcher) restartLocked() {
	if w.cancel != nil {
		w.kicked = true
		w.cancel()
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// onChange makes the watcher call f, from its own goroutine and without
// its mutex held, with each state of s's key that a later answer brings
// and that differs from the one before (failures are not passed on: a
// held lease's safe-until bounds how long it can be blind). It returns
// s's latest state, for the caller to judge first. f must not block.
func (w *watcher) onChange(s *sub, f func(state)) state {
	w.mu.Lock()
	defer w.mu.Unlock()
	s.hook = f
	return s.st
}

// latest returns s's state.
func (w *watcher) latest(s *sub) state {
	w.mu.Lock()
	defer w.mu.Unlock()
	return s.st
}

// next waits for a state of s newer than after and returns it with true;
// or, when retry is positive and passes first, returns s's current state
// with false. It fails when ctx ends, stop is closed or the watcher closes.
func (w *watcher) next(ctx context.Context, s *sub, after uint64, retry time.Duration, stop <-chan struct{}) (state, bool, error) {
	var timeout <-chan time.Time
	if retry > 0 {
		t := time.NewTimer(retry)
		defer t.Stop()
		timeout = t.C
	}
	for {
		if st := w.latest(s); st.seq > after {
			return st, true, nil
		}
		select {
		case <-s.ch:
		case <-timeout:
			return w.latest(s), false, nil
		case <-ctx.Done():
			return state{}, false, ctx.Err()
		case <-stop:
			return state{}, false, errStopped
		case <-w.ctx.Done():
			return state{}, false, errStopped
		}
	}
}

// errStopped is next's error when the caller's session or the Backend ended.
var errStopped = errors.New("consul: watch stopped")

func (w *watcher) run() {
	defer w.wg.Done()
	backoff := time.Duration(0)
	for {
		w.mu.Lock()
		if w.closed || len(w.subs) == 0 {
			w.running = false
			w.prefix, w.index, w.last = "", 0, nil
			w.mu.Unlock()
			return
		}
		if p := w.commonPrefixLocked(); p != w.prefix {
			w.prefix, w.index, w.last = p, 0, nil
		}
		prefix, waitIndex := w.prefix, w.index
		w.queries++
		issued := w.queries
		// The server answers after wait plus up to wait/16 of jitter; a
		// connection that died silently must not hold the watch longer.
		ctx, cancel := context.WithTimeout(w.ctx, w.wait+w.wait/16+5*time.Second)
		w.cancel, w.kicked = cancel, false
		w.mu.Unlock()

		// Consistent, so that an answer to a query issued after a key was
		// won reflects a state after the win (see state.current).
		q := &api.QueryOptions{WaitIndex: waitIndex, WaitTime: w.wait, RequireConsistent: true}
		pairs, meta, err := w.kv.List(prefix, q.WithContext(ctx))
		cancel()

		w.mu.Lock()
		w.cancel = nil
		if w.closed || w.kicked {
			w.mu.Unlock()
			continue
		}
		if err != nil {
			w.failedLocked(err)
			w.mu.Unlock()
			backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
			w.log.Debug("watch failed; retrying", "prefix", prefix, "err", err, "retry_in", backoff)
			w.pause(backoff)
			continue
		}
		backoff = 0
		hooks := w.answeredLocked(pairs, meta.LastIndex, issued)
		w.mu.Unlock()
		for _, h := range hooks {
			h.f(h.st)
		}
	}
}

// failedLocked passes a failed query's error on to every subscriber.
func (w *watcher) failedLocked(err error) {
	w.seq++
	for s := range w.subs {
		s.st.seq, s.st.err = w.seq, err
		s.force = false
		poke(s)
	}
}

// pause waits d, or until the watcher is kicked or its context ends.
func (w *watcher) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.kick:
	case <-w.ctx.Done():
	}
}

// hookCall is a call of a sub's hook, made once the mutex is released.
type hookCall struct {
	f  func(state)
	st state
}

// answeredLocked takes the answer to query number issued, the prefix's
// pairs at index, and wakes the subscribers whose key's state changed;
// it returns the hooks to call with their new states.
func (w *watcher) answeredLocked(pairs api.KVPairs, index, issued uint64) []hookCall {
	// An index that went backwards (tombstones reaped, a snapshot
	// restored) is used as it is: waiting on it still wakes on the next
	// change. Zero would not block at all.
	w.index = max(index, 1)
	w.last = make(map[string]*api.KVPair, len(pairs))
	for _, p := range pairs {
		w.last[p.Key] = p
	}
	w.seq++
	var hooks []hookCall
	for s := range w.subs {
		next := state{seq: w.seq, pair: w.last[s.key], index: w.index, current: issued > s.since}
		if s.force || s.st.seq == 0 || s.st.err != nil || next.current != s.st.current || !samePair(s.st.pair, next.pair) {
			s.st, s.force = next, false
			if s.last != nil && s.last(next) {
				delete(w.subs, s) // the loop issues no query for it: see sub.last
			}
			if s.hook != nil {
				hooks = append(hooks, hookCall{s.hook, next})
				continue
			}
			poke(s)
		}
	}
	return hooks
}

func poke(s *sub) {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// samePair reports whether a and b are the same version of a key.
func samePair(a, b *api.KVPair) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.ModifyIndex == b.ModifyIndex && a.Session == b.Session
}

// commonPrefixLocked returns the longest common prefix of the watched keys.
func (w *watcher) commonPrefixLocked() string {
	first := true
	var p string
	for s := range w.subs {
		if first {
			p, first = s.key, false
			continue
		}
		n := 0
		for n < len(p) && n < len(s.key) && p[n] == s.key[n] {
			n++
		}
		p = p[:n]
	}
	return p
}

func hasPrefix(s, prefix string) bool { return len(s) >= len(prefix) && s[:len(prefix)] == prefix }
