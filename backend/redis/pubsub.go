package redis

import (
	"context"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// NotifyStatus says how this process's waiters learn of releases.
type NotifyStatus struct {
	// Listening is true while the pub/sub connection is subscribed.
	Listening bool
	// Polling is true when pub/sub was turned off: waiters read their
	// leases every PollInterval.
	Polling bool
	// Reason says why Polling.
	Reason string
}

// Notifications reports how waiters learn of releases. Whatever it says,
// a waiter also reads its lease every PollInterval and when the holder's
// key is due to expire: a redsync release and a key's expiry publish
// nothing.
func (b *Backend) Notifications() NotifyStatus {
	b.listen.mu.Lock()
	defer b.listen.mu.Unlock()
	return NotifyStatus{Listening: b.listen.up, Polling: b.listen.polling, Reason: b.listen.reason}
}

// listener is a Backend's one pub/sub connection and the waiters it wakes.
type listener struct {
	b *Backend

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	up      bool
	polling bool
	reason  string
}

func newListener(b *Backend) *listener {
	return &listener{b: b, waiters: map[string]map[chan struct{}]struct{}{}}
}

// subscribe returns a channel that receives a value after each release
// of lease name (and whenever one may have been missed), until cancel.
func (l *listener) subscribe(name string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.waiters[name] == nil {
		l.waiters[name] = map[chan struct{}]struct{}{}
	}
	l.waiters[name][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.waiters[name], ch)
		if len(l.waiters[name]) == 0 {
			delete(l.waiters, name)
		}
		l.mu.Unlock()
	}
}

// wake signals the waiters of name, or every waiter when all is true.
func (l *listener) wake(name string, all bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for n, chans := range l.waiters {
		if !all && n != name {
			continue
		}
		for ch := range chans {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

func (l *listener) setUp(up bool) {
	l.mu.Lock()
	was := l.up
	l.up = up
	l.mu.Unlock()
	if up != was {
		l.wake("", true) // a release may have gone unheard meanwhile
	}
}

func (l *listener) off(reason string) {
	l.mu.Lock()
	l.up, l.polling, l.reason = false, true, reason
	l.mu.Unlock()
	l.b.o.log.Info("waiters poll for releases instead of being woken by pub/sub", "reason", reason, "poll_interval", l.b.o.poll)
}

// run keeps one subscription to the release channel until ctx ends.
// go-redis reconnects the connection after a failure (a failover client
// to the new primary) and subscribes again; while it is down, waiters
// poll.
func (l *listener) run(ctx context.Context) {
	b := l.b
	prefix := b.o.Prefix + "lease:"
	ps := b.c.Subscribe(ctx, Channel(b.o.Prefix))
	defer ps.Close()
	for ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(ctx, b.o.poll)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if isTimeout(err) {
				// Quiet: check the connection, so that a dead one is
				// noticed and replaced.
				if perr := ps.Ping(ctx); perr != nil {
					l.setUp(false)
				}
				continue
			}
			l.setUp(false)
			b.o.log.Debug("pub/sub connection failed; waiters poll until it is back", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(b.o.cfg.RenewInterval / 4):
			}
			continue
		}
		switch m := msg.(type) {
		case *goredis.Subscription:
			l.setUp(m.Kind == "subscribe")
		case *goredis.Message:
			l.wake(strings.TrimPrefix(m.Payload, prefix), false)
		case *goredis.Pong:
			l.setUp(true)
		}
	}
}

func isTimeout(err error) bool {
	t, ok := err.(interface{ Timeout() bool })
	return ok && t.Timeout()
}
