package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/jackc/pgx/v5"
)

// NotifyStatus says how this process's waiters learn of releases.
type NotifyStatus struct {
	// Listening is true while a LISTEN connection delivers notifications:
	// waiters wake at once on a release or hand-over.
	Listening bool
	// Polling is true while notifications are found not to work (the last
	// LISTEN probe failed; it is tried again later) or are turned off:
	// waiters read their leases every PollInterval.
	Polling bool
	// Reason says why Polling, for logs and `baton leader`.
	Reason string
}

// Notifications reports how waiters learn of releases: through LISTEN, or
// by polling (and why). Before the first probe finished, and while the
// LISTEN connection is being re-established, neither field is true and
// waiters poll.
func (b *Backend) Notifications() NotifyStatus {
	b.listen.mu.Lock()
	defer b.listen.mu.Unlock()
	return NotifyStatus{Listening: b.listen.up, Polling: b.listen.polling, Reason: b.listen.reason}
}

// probeTimeout is how long the probe waits for its own notification. On a
// direct connection it arrives in a round trip; through PgBouncer in
// transaction-pooling mode it never does.
const probeTimeout = 5 * time.Second

// probeRetry and probeRetryMax: after a failed probe, waiters poll, and
// the probe is tried again after probeRetry, then at doubling intervals up
// to probeRetryMax, so that a probe that failed for a passing reason (a
// server too slow to deliver it in time, a listen URL that led to a
// pooler for a while) does not leave the process polling until it
// restarts. Through PgBouncer each retry costs one connection for
// probeTimeout and one NOTIFY.
const (
	probeRetry    = time.Minute
	probeRetryMax = 16 * time.Minute
)

// listener is a Backend's one LISTEN connection and the waiters it wakes.
type listener struct {
	b *Backend

	// w are the WatchLeader calls (woken by the schema's channel, on
	// every release and acquisition) and the campaigns (woken by the
	// process's own channel, when it heads a released lease's queue).
	w backend.Wakers

	mu      sync.Mutex
	up      bool // notifications flow now
	polling bool // the last probe found that notifications do not arrive
	reason  string
	warned  bool // the switch to polling was logged
}

func newListener(b *Backend) *listener {
	return &listener{b: b}
}

func (l *listener) listening() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.up
}

func (l *listener) setUp(up bool) {
	l.mu.Lock()
	l.up = up
	recovered := up && l.polling
	if up {
		l.polling, l.reason = false, ""
	}
	l.mu.Unlock()
	if recovered {
		l.b.o.log.Info("notifications arrive again: waiters are woken at once on a release")
	}
	if !up {
		l.w.WakeAll() // they may have missed a notification: read again
	}
}

// off switches to polling, saying why once.
func (l *listener) off(reason string) {
	l.mu.Lock()
	l.up, l.polling, l.reason = false, true, reason
	warned := l.warned
	l.warned = true
	l.mu.Unlock()
	if !warned {
		l.b.o.log.Warn("waiters poll for releases instead of being notified", "reason", reason, "poll_interval", l.b.o.poll)
	}
	l.w.WakeAll()
}

// run keeps one LISTEN connection until ctx ends, reconnecting after
// failures. When a probe shows that notifications do not arrive, waiters
// poll, and the probe is tried again at growing intervals (probeRetry).
func (l *listener) run(ctx context.Context) {
	retry := l.b.o.cfg.RenewInterval / 4
	lt := l.b.o.listenTiming
	backoff := lt.retry
	for ctx.Err() == nil {
		probed, err := l.session(ctx)
		l.setUp(false)
		if probed {
			backoff = lt.retry // notifications worked: a later failed probe starts afresh
		}
		wait := retry
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errNoDelivery):
			l.off("LISTEN does not deliver notifications on this connection (PgBouncer in transaction-pooling mode?); set Options.Listen (the CLI: ?baton_listen=URL) to a direct connection to be woken at once")
			l.b.o.log.Debug("the LISTEN probe failed; trying it again later", "in", backoff)
			wait, backoff = backoff, min(2*backoff, lt.retryMax)
		default:
			l.b.o.log.Debug("LISTEN connection failed; waiters poll until it is back", "err", l.b.safeErr(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

var errNoDelivery = errors.New("postgres: LISTEN delivered no notification")

// session runs one LISTEN connection: it connects, listens, checks with a
// probe that notifications arrive, and dispatches them until an error. A
// connection silent for listenTiming.ping is pinged, and given up when the
// ping is not answered within listenTiming.pingTimeout: a half-open
// connection (its server or the path to it gone without a word) delivers
// nothing and reports no error until TCP keepalive gives up, which takes
// hours with Linux's defaults. probed reports that the probe succeeded.
func (l *listener) session(ctx context.Context) (probed bool, err error) {
	b := l.b
	lt := b.o.listenTiming
	cctx, cancel := context.WithTimeout(ctx, b.o.cfg.TTL)
	var conn *pgx.Conn
	if b.o.Listen != nil {
		conn, err = pgx.ConnectConfig(cctx, b.o.Listen)
	} else {
		var pc interface{ Hijack() *pgx.Conn }
		c, aerr := b.pool.Acquire(cctx)
		if aerr == nil {
			pc = c
			conn = pc.Hijack() // ours alone, never returned to the pool
		}
		err = aerr
	}
	if err != nil {
		cancel()
		return false, err
	}
	defer func() {
		cl, ccancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cl)
		ccancel()
	}()
	// The application_name tells releases that this process listens
	// (wakeHeads).
	if _, err := conn.Exec(cctx, "SET application_name = '"+listenerAppName(b.id)+"'; LISTEN "+b.q.channel+"; LISTEN "+b.q.probe+"; LISTEN "+WakeChannel(b.id), pgx.QueryExecModeSimpleProtocol); err != nil {
		cancel()
		return false, err
	}
	// The probe goes through the pool, as a release does, on a channel of
	// its own (a lease may have any name).
	probe := randomID()
	if _, err := b.exec(cctx, "SELECT pg_notify($1, $2)", b.q.probe, probe); err != nil {
		cancel()
		return false, err
	}
	cancel()
	pctx, pcancel := context.WithTimeout(ctx, probeTimeout)
	for {
		n, err := conn.WaitForNotification(pctx)
		if err != nil {
			pcancel()
			if ctx.Err() == nil && pctx.Err() != nil {
				return false, errNoDelivery
			}
			return false, err
		}
		if n.Channel == b.q.probe && n.Payload == probe {
			break
		}
	}
	pcancel()
	l.setUp(true)
	l.w.WakeAll() // a release may have come before we listened
	b.o.log.Debug("listening for releases", "channel", b.q.channel)
	for {
		// A wait that times out leaves the connection usable (pgx sets a
		// read deadline, and a timeout does not close the connection).
		wctx, wcancel := context.WithTimeout(ctx, lt.ping)
		n, err := conn.WaitForNotification(wctx)
		wcancel()
		if err != nil {
			if ctx.Err() != nil || !errors.Is(wctx.Err(), context.DeadlineExceeded) {
				return true, err
			}
			pctx, pcancel := context.WithTimeout(ctx, lt.pingTimeout)
			// An empty statement, through pgx so that a tracer counts it.
			_, err := conn.Exec(pctx, "-- ping", pgx.QueryExecModeSimpleProtocol)
			pcancel()
			if err != nil {
				return true, fmt.Errorf("the LISTEN connection did not answer a ping within %s: %w", lt.pingTimeout, err)
			}
			continue
		}
		switch n.Channel {
		case b.q.channel:
			l.w.Wake(n.Payload, false)
		case WakeChannel(b.id):
			b.o.log.Debug("woken", "lease", n.Payload)
			if !l.w.Wake(n.Payload, true) {
				// Woken for a lease this process no longer waits for
				// (its campaign ended before it left the queue): pass it on.
				b.leave(n.Payload)
			}
		}
	}
}
