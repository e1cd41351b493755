package zookeeper

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/go-zookeeper/zk"
)

// Dial connects to the ZooKeeper ensemble at servers ("host:port"; the
// port defaults to 2181) with a session timeout of opts.TTL, waits within
// ctx for a session (and adds opts.Digest to it), and returns a Backend
// that owns the connection: its Close closes the session, which deletes
// the Backend's nodes on the server at once.
func Dial(ctx context.Context, servers []string, opts DialOptions) (*Backend, error) {
	cfg, err := opts.check(servers)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	zlog := log.WithGroup("zookeeper").WithGroup("client")
	var base zk.Dialer = net.DialTimeout
	if opts.TLS != nil {
		base = tlsDialer(opts.TLS)
	}
	probe := NewSessionProbe(base)
	watches := NewWatches()
	conn, _, err := zk.Connect(servers, cfg.TTL,
		zk.WithDialer(probe.Dial),
		zk.WithLogger(clientLogger{zlog}),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession {
				zlog.Debug("connection state", "state", ev.State.String(), "server", ev.Server)
			}
			watches.Callback(ev)
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("zookeeper: connect to %s: %w", strings.Join(servers, ","), err)
	}
	opts.Probe, opts.Watches = probe, watches
	b, err := New(conn, opts.Options)
	if err != nil {
		conn.Close()
		return nil, err
	}
	b.owned = true
	// The first request waits for a session, so it tells whether the
	// servers (and the TLS set-up) work before anyone relies on them.
	if opts.Digest != "" {
		_, err = retry(ctx, b, nil, func() (struct{}, error) { return struct{}{}, conn.AddAuth("digest", []byte(opts.Digest)) })
	} else {
		_, err = retry(ctx, b, nil, func() (bool, error) { ok, _, err := conn.Exists("/"); return ok, err })
	}
	if err != nil {
		if ctx.Err() != nil {
			// No session: there is nothing to end on a server, but the
			// client's Close waits up to a second for the answer to its
			// close request, which a server that never answered will not
			// send. Return by ctx's deadline and let it finish on its own.
			go func() { _ = b.Close(context.Background()) }()
			return nil, fmt.Errorf("%w: zookeeper %s: no session before the context ended: %w", baton.ErrBackendUnavailable, strings.Join(servers, ","), ctx.Err())
		}
		_ = b.Close(context.Background())
		return nil, fmt.Errorf("%w: zookeeper %s: %w", baton.ErrBackendUnavailable, strings.Join(servers, ","), err)
	}
	return b, nil
}

// check reports every problem with o and servers at once, as a
// *baton.ConfigError, and returns o's timing, defaults filled in.
func (o DialOptions) check(servers []string) (backend.Config, error) {
	cfg, _, _, err := o.validate()
	var problems []string
	var cerr *baton.ConfigError
	if errors.As(err, &cerr) {
		problems = append(problems, cerr.Problems...)
	} else if err != nil {
		return cfg, err
	}
	if len(servers) == 0 {
		problems = append(problems, "zookeeper: no servers: name at least one, as in 127.0.0.1:2181")
	}
	for _, s := range servers {
		if strings.TrimSpace(s) == "" {
			problems = append(problems, "zookeeper: a server address is empty")
		}
	}
	if o.Digest != "" && !strings.Contains(o.Digest, ":") {
		problems = append(problems, "zookeeper: Digest must be \"user:password\"")
	}
	if len(problems) > 0 {
		return cfg, &baton.ConfigError{Problems: problems}
	}
	return cfg, nil
}

// tlsDialer dials TLS with cfg; the client's connect timeout covers the
// handshake too.
func tlsDialer(cfg *tls.Config) zk.Dialer {
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: cfg}
		return d.Dial(network, address)
	}
}

// clientLogger sends go-zookeeper's log lines, chiefly its reconnection
// attempts, to slog at debug level: the Backend reports what matters.
type clientLogger struct{ log *slog.Logger }

func (l clientLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...))
}
