package consul

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// watcher keeps the blocking queries of a Backend: recursive reads of the
// keys the Backend waits for or holds. Each HTTP blocking query occupies a
// connection to the agent, which allows only 200 per client address by
// default (limits.http_max_conns_per_client), so a query per key would not
// scale to a process with many leases; and Consul's KV API has no change
// feed for a prefix, nor a filter on a listing, so a query's every answer
// is every key under its prefix. The watcher therefore splits the keys it
// watches into groups (shards), each a blocking query on the common prefix
// of its keys: a change wakes the one query whose prefix holds the key, and
// costs a read of its group. It starts with one group and, when an answer
// holds more than splitAt keys, splits that group by the character after
// its common prefix at a change that follows a quiet while (see run), up
// to maxShards queries in all.
//
// Subscribers see the latest state of their key, and are woken only when it
// changed. Safe for concurrent use.
type watcher struct {
	kv   *api.KV
	ctx  context.Context // the Backend's: ends at Close
	wg   sync.WaitGroup  // the shards' goroutines; see done
	wait time.Duration   // the blocking queries' wait time
	log  *slog.Logger

	// maxShards bounds the number of groups (and so of blocking queries,
	// and of connections they hold); splitAt is the size of an answer
	// above which a group is split, at a change after quiet without one.
	maxShards, splitAt int
	quiet              time.Duration
	// stormLeases is how many leases of a group above splitAt must have
	// had a key changed since its last answer, which came back without
	// waiting, for its next query to wait a pause (see run).
	stormLeases int

	mu     sync.Mutex
	closed bool
	seq    uint64   // answers (and failures) delivered so far, by any shard
	shards []*shard // the first is the root, for keys no other shard's root prefixes
	splits []string // the prefixes at which shards were split
}

// shard is one group of the watched keys and its blocking query. Its
// fields are guarded by watcher.mu.
type shard struct {
	// root is the prefix of the keys routed to this shard (the longest
	// root that prefixes a key wins); "" for the first shard.
	root    string
	running bool // the shard's goroutine is active
	subs    map[*sub]struct{}
	prefix  string                 // of the query in flight, or of the last answer
	index   uint64                 // the last answer's index; 0 before the first
	last    map[string]*api.KVPair // the last answer, by key
	queries uint64                 // queries issued so far
	cancel  context.CancelFunc     // of the query in flight
	kicked  bool                   // cancel was called to re-issue the query
	kick    chan struct{}          // wakes the loop from a back-off
}

// sub is one subscriber's view of one key.
type sub struct {
	key string
	ch  chan struct{} // poked, without blocking, when st changes

	// Guarded by watcher.mu.
	sh    *shard // the group whose query watches key
	since uint64 // sh.queries when it subscribed (or moved to sh): later queries are current
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
		kv:          kv,
		ctx:         ctx,
		wait:        wait,
		log:         log,
		maxShards:   maxWatchQueries,
		splitAt:     watchSplitAt,
		quiet:       watchQuiet,
		stormLeases: watchStormLeases,
		shards:      []*shard{newShard("")},
	}
}

func newShard(root string) *shard {
	return &shard{root: root, subs: map[*sub]struct{}{}, kick: make(chan struct{}, 1)}
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
	sh := w.routeLocked(key)
	s := &sub{key: key, ch: make(chan struct{}, 1), sh: sh, since: sh.queries, last: last}
	sh.subs[s] = struct{}{}
	switch {
	case !sh.running:
		w.startLocked(sh)
	case !hasPrefix(key, sh.prefix):
		w.restartLocked(sh) // widen the query to cover key
	case sh.index > 0:
		// The last answer covers key: a waiter can act on it at once.
		w.seq++
		s.st = state{seq: w.seq, pair: sh.last[key], index: sh.index}
		s.ch <- struct{}{}
		if last != nil && last(s.st) {
			w.dropLocked(s)
		}
	}
	return s
}

// routeLocked returns the shard for key: the one with the longest root
// that prefixes it. A key that only the first shard takes but that lies
// under a prefix split before (a new lease beside the split ones) gets a
// shard of its own at once, while maxShards allows: otherwise the first
// shard's query would widen, key after key, abandoning a query each time.
func (w *watcher) routeLocked(key string) *shard {
	best := w.shards[0]
	for _, sh := range w.shards[1:] {
		if len(sh.root) > len(best.root) && hasPrefix(key, sh.root) {
			best = sh
		}
	}
	if best.root != "" || len(w.shards) >= w.maxShards {
		return best
	}
	split := ""
	for _, p := range w.splits {
		if len(p) > len(split) && len(key) > len(p) && hasPrefix(key, p) {
			split = p
		}
	}
	if split == "" {
		return best
	}
	sh := newShard(key[:len(split)+1])
	w.shards = append(w.shards, sh)
	return sh
}

func (w *watcher) startLocked(sh *shard) {
	sh.running = true
	w.wg.Add(1)
	go w.run(sh)
}

// dropLocked removes s; when nothing is left for its shard to watch, the
// query in flight is abandoned and the shard's loop ends.
func (w *watcher) dropLocked(s *sub) {
	sh := s.sh
	if _, ok := sh.subs[s]; !ok {
		return
	}
	delete(sh.subs, s)
	if len(sh.subs) == 0 {
		w.restartLocked(sh)
	}
}

// rebase makes only answers to queries issued from now on current for s:
// a waiter that has just won its key hands its subscription to the term,
// whose judgements must not rest on answers from before it won.
func (w *watcher) rebase(s *sub) {
	w.mu.Lock()
	s.since = s.sh.queries
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

// unsubscribe stops watching s's key. When nothing is left for its shard
// to watch, the query in flight is abandoned and the shard's loop ends.
func (w *watcher) unsubscribe(s *sub) {
	if s == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropLocked(s)
}

// close ends the loops for good; later subscriptions return nil.
func (w *watcher) close() {
	w.mu.Lock()
	w.closed = true
	for _, sh := range w.shards {
		w.restartLocked(sh)
	}
	w.mu.Unlock()
}

// done waits for the shards' goroutines, which return once the context
// given to newWatcher ended.
func (w *watcher) done() { w.wg.Wait() }

func (w *watcher) restartLocked(sh *shard) {
	if sh.cancel != nil {
		sh.kicked = true
		sh.cancel()
	}
	select {
	case sh.kick <- struct{}{}:
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

func (w *watcher) run(sh *shard) {
	defer w.wg.Done()
	backoff := time.Duration(0)
	for {
		w.mu.Lock()
		if w.closed || len(sh.subs) == 0 {
			sh.running = false
			sh.prefix, sh.index, sh.last = "", 0, nil
			if sh.root != "" {
				w.removeLocked(sh)
			}
			w.mu.Unlock()
			return
		}
		// A shard other than the first reads all of its root, so that a key
		// routed to it later needs no wider query.
		p := sh.root
		if p == "" {
			p = commonPrefix(sh.subs)
		}
		if p != sh.prefix {
			sh.prefix, sh.index, sh.last = p, 0, nil
		}
		prefix, waitIndex := sh.prefix, sh.index
		sh.queries++
		issued := sh.queries
		// The server answers after wait plus up to wait/16 of jitter; a
		// connection that died silently must not hold the watch longer.
		ctx, cancel := context.WithTimeout(w.ctx, w.wait+w.wait/16+5*time.Second)
		sh.cancel, sh.kicked = cancel, false
		w.mu.Unlock()

		// Consistent, so that an answer to a query issued after a key was
		// won reflects a state after the win (see state.current).
		q := &api.QueryOptions{WaitIndex: waitIndex, WaitTime: w.wait, RequireConsistent: true}
		sent := time.Now()
		pairs, meta, err := w.kv.List(prefix, q.WithContext(ctx))
		cancel()

		w.mu.Lock()
		sh.cancel = nil
		if w.closed || sh.kicked {
			w.mu.Unlock()
			continue
		}
		if err != nil {
			w.failedLocked(sh, err)
			w.mu.Unlock()
			backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
			w.log.Debug("watch failed; retrying", "prefix", prefix, "err", err, "retry_in", backoff)
			w.pause(sh, backoff)
			continue
		}
		backoff = 0
		hooks := w.answeredLocked(sh, pairs, meta.LastIndex, issued)
		// A group too big for its changes to be cheap is split at a
		// change that came after it was quiet for a while (its query
		// waited): while keys change faster, one query reads many
		// changes per answer, and splitting would only multiply the
		// requests. The answer that brought the change is read anyway.
		took := time.Since(sent)
		if len(pairs) > w.splitAt && waitIndex > 0 && took >= w.quiet {
			w.splitLocked(sh)
		}
		w.mu.Unlock()
		for _, h := range hooks {
			h.f(h.st)
		}
		if len(pairs) > w.splitAt && waitIndex > 0 && took < w.quiet && leasesChanged(pairs, waitIndex, w.stormLeases) >= w.stormLeases {
			// A storm: a big group in which the keys of several leases
			// changed since the last answer, which came back without
			// waiting (as while many processes campaign at once). It is
			// read at a pace: read back to back, every Backend on the
			// agent would re-read its big groups as fast as the agent
			// answers, the agent would spend its time encoding them, and
			// its other requests (reads, campaigns, session renewals)
			// would time out. A change reaches the group's subscribers
			// up to the pause later; a new subscriber's kick ends it. A
			// sequence of hand-overs of one lease changes one lease's
			// keys per answer, and is followed as fast as the agent
			// answers.
			w.pause(sh, w.stormPause(len(pairs)))
		}
	}
}

// leasesChanged counts the leases with a key changed after index, up to
// limit. A key's lease is its path up to its first segment that starts
// with "." (".lock", ".baton-epoch", ".baton-state", ".baton-queue/…");
// under a Prefix that itself holds "/.", every key counts as one lease, and
// no group is paced.
func leasesChanged(pairs api.KVPairs, index uint64, limit int) int {
	var seen []string
	for _, p := range pairs {
		if p.ModifyIndex <= index {
			continue
		}
		lease := p.Key
		if i := strings.Index(p.Key, "/."); i >= 0 {
			lease = p.Key[:i]
		}
		if !slices.Contains(seen, lease) {
			if seen = append(seen, lease); len(seen) >= limit {
				break
			}
		}
	}
	return len(seen)
}

// stormPause is how long a group whose answer of n keys came in a storm
// rests before its next query: so that a storming group is read at about
// 4 × splitAt keys per quiet time (4,096 keys a second), however big, up
// to four quiet times.
func (w *watcher) stormPause(n int) time.Duration {
	return min(4*w.quiet, time.Duration(n)*w.quiet/time.Duration(4*w.splitAt))
}

// splitLocked moves sh's subscribers to new shards, one per character
// that follows the common prefix of their keys, when there are at least
// two such characters and the new shards fit within maxShards. sh's loop
// then ends (it has no subscribers left) and the new shards' loops start,
// each with a query on its own keys' prefix. A key equal to the common
// prefix has no next character: then sh stays whole.
func (w *watcher) splitLocked(sh *shard) {
	groups := w.groupsLocked(sh)
	if groups == nil {
		return
	}
	p := commonPrefix(sh.subs)
	if !slices.Contains(w.splits, p) {
		w.splits = append(w.splits, p)
	}
	for c, subs := range groups {
		child := newShard(p + string(c))
		w.shards = append(w.shards, child)
		for _, s := range subs {
			delete(sh.subs, s)
			child.subs[s] = struct{}{}
			// The child's first answer reaches s whatever it shows: s's
			// seq orders states across shards, and an answer to a query
			// the child issues is as current as any of sh's.
			s.sh, s.since, s.force = child, 0, true
		}
		w.startLocked(child)
	}
	w.log.Debug("watch split", "prefix", p, "groups", len(groups), "queries", len(w.shards))
}

// groupsLocked returns sh's subscribers by the character that follows
// the common prefix of their keys, or nil when they cannot be split: fewer
// than two such characters, a key equal to the prefix, or more groups than
// maxShards leaves room for.
func (w *watcher) groupsLocked(sh *shard) map[byte][]*sub {
	p := commonPrefix(sh.subs)
	groups := map[byte][]*sub{}
	for s := range sh.subs {
		if len(s.key) == len(p) {
			return nil
		}
		groups[s.key[len(p)]] = append(groups[s.key[len(p)]], s)
	}
	if len(groups) < 2 || len(w.shards)+len(groups) > w.maxShards {
		return nil
	}
	return groups
}

// removeLocked takes sh, which watches nothing, out of the routing; keys
// under its root go to the shard with the next longest root.
func (w *watcher) removeLocked(sh *shard) {
	for i, x := range w.shards {
		if x == sh {
			w.shards = append(w.shards[:i], w.shards[i+1:]...)
			return
		}
	}
}

// failedLocked passes a failed query's error on to sh's subscribers.
func (w *watcher) failedLocked(sh *shard, err error) {
	w.seq++
	for s := range sh.subs {
		s.st.seq, s.st.err = w.seq, err
		s.force = false
		poke(s)
	}
}

// pause waits d, or until sh is kicked or the watcher's context ends.
func (w *watcher) pause(sh *shard, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-sh.kick:
	case <-w.ctx.Done():
	}
}

// hookCall is a call of a sub's hook, made once the mutex is released.
type hookCall struct {
	f  func(state)
	st state
}

// answeredLocked takes the answer to sh's query number issued, the
// prefix's pairs at index, and wakes the subscribers whose key's state
// changed; it returns the hooks to call with their new states.
func (w *watcher) answeredLocked(sh *shard, pairs api.KVPairs, index, issued uint64) []hookCall {
	// An index that went backwards (tombstones reaped, a snapshot
	// restored) is used as it is: waiting on it still wakes on the next
	// change. Zero would not block at all.
	sh.index = max(index, 1)
	sh.last = make(map[string]*api.KVPair, len(pairs))
	for _, p := range pairs {
		sh.last[p.Key] = p
	}
	w.seq++
	var hooks []hookCall
	for s := range sh.subs {
		next := state{seq: w.seq, pair: sh.last[s.key], index: sh.index, current: issued > s.since}
		if s.force || s.st.seq == 0 || s.st.err != nil || next.current != s.st.current || !samePair(s.st.pair, next.pair) {
			s.st, s.force = next, false
			if s.last != nil && s.last(next) {
				delete(sh.subs, s) // the loop issues no query for it: see sub.last
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

// commonPrefix returns the longest common prefix of subs' keys.
func commonPrefix(subs map[*sub]struct{}) string {
	first := true
	var p string
	for s := range subs {
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
