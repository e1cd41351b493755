package redis

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/backend"
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

// listener is a Backend's one pub/sub connection and the waiters it
// wakes. It subscribes to two channels: the release channel (Channel),
// on which every release and acquisition is published, wakes the leader
// watchers (WatchLeader); the process channel (WakeChannel), on which a
// release wakes this process when it heads the lease's queue, wakes its
// campaign. So a release wakes one waiting process, not all of them.
type listener struct {
	b *Backend

	// w are the WatchLeader calls and the campaigns.
	w backend.Wakers

	mu      sync.Mutex
	up      bool
	polling bool
	reason  string
}

func newListener(b *Backend) *listener {
	return &listener{b: b}
}

func (l *listener) setUp(up bool) {
	l.mu.Lock()
	was := l.up
	l.up = up
	l.mu.Unlock()
	if up != was {
		l.w.WakeAll() // a release may have gone unheard meanwhile
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
	own := WakeChannel(b.o.Prefix, b.id)
	ps := b.c.Subscribe(ctx, Channel(b.o.Prefix), own)
	defer ps.Close()
	// A receive blocks on the connection up to PollInterval, whatever
	// ctx: closing the connection ends it when ctx ends (Close).
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
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
			if m.Channel == own {
				// Up once both channels are subscribed, own being the
				// second.
				l.setUp(m.Kind == "subscribe")
			}
		case *goredis.Message:
			if m.Channel == own && strings.HasPrefix(m.Payload, "\x00") {
				if key, g, ok := parseGrant(m.Payload); ok {
					b.granted(key, g)
				}
				break
			}
			name := strings.TrimPrefix(m.Payload, prefix)
			if m.Channel != own {
				l.w.Wake(name, false)
				break
			}
			b.o.log.Debug("woken", "lease", name)
			if !l.w.Wake(name, true) {
				// Woken for a lease this process no longer waits for (its
				// campaign ended before it left the queue): pass it on.
				b.leave(b.keys(name))
			}
		case *goredis.Pong:
			l.setUp(true)
		}
	}
}

func isTimeout(err error) bool {
	t, ok := err.(interface{ Timeout() bool })
	return ok && t.Timeout()
}

// parseGrant parses a grant sent on the process channel (wakeHeadLua):
// NUL STAMP NUL VALUE NUL KEY.
func parseGrant(p string) (key string, g grant, ok bool) {
	f := strings.SplitN(p, "\x00", 4)
	if len(f) != 4 || f[0] != "" {
		return "", grant{}, false
	}
	stamp, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", grant{}, false
	}
	return f[3], grant{stamp: stamp, value: f[2]}, true
}
