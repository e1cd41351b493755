package backend

import "sync"

// Wakers are the wake-up channels of a process's waiters on a store that
// pushes changes (pub/sub, NOTIFY), by lease name, in two sets: campaigns,
// woken when this process may take the lease, and watchers of who holds
// it, woken on every change. The store's listener wakes them; a wake-up
// that finds a channel full merges with the one it holds, so a slow
// waiter reads once for many. The zero value is ready to use.
type Wakers struct {
	mu   sync.Mutex
	sets [2]map[string]map[chan struct{}]struct{} // watchers, campaigns
}

func setOf(campaign bool) int {
	if campaign {
		return 1
	}
	return 0
}

// Subscribe returns a channel that receives a value after each wake-up of
// name's campaigns (campaign true) or watchers, until cancel.
func (w *Wakers) Subscribe(name string, campaign bool) (wake <-chan struct{}, cancel func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	i := setOf(campaign)
	if w.sets[i] == nil {
		w.sets[i] = map[string]map[chan struct{}]struct{}{}
	}
	set := w.sets[i]
	if set[name] == nil {
		set[name] = map[chan struct{}]struct{}{}
	}
	set[name][ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(set[name], ch)
		if len(set[name]) == 0 {
			delete(set, name)
		}
		w.mu.Unlock()
	}
}

// Wake wakes name's campaigns (campaign true) or watchers, and reports
// whether there was any to wake.
func (w *Wakers) Wake(name string, campaign bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	chans := w.sets[setOf(campaign)][name]
	signalAll(chans)
	return len(chans) > 0
}

// WakeAll wakes every campaign and watcher: after notifications may have
// been missed (a listener reconnected, or started after they subscribed).
func (w *Wakers) WakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, set := range w.sets {
		for _, chans := range set {
			signalAll(chans)
		}
	}
}

func signalAll(chans map[chan struct{}]struct{}) {
	for ch := range chans {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
