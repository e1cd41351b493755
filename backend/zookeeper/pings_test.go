package zookeeper_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// packets counts the requests clients write to a ZooKeeper server, from
// the bytes a testserver.Proxy taps: pings and the rest (the connect
// request, each connection's first frame, is not counted), and the
// connections that made one (the probe's srvr connections make none).
type packets struct {
	mu            sync.Mutex
	conns         int
	pings, others int
	lastPing      time.Time // when the last ping passed
}

func (p *packets) newTap() io.Writer { return &packetTap{p: p} }

func (p *packets) counts() (conns, pings, others int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns, p.pings, p.others
}

func (p *packets) lastPingAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastPing
}

func (p *packets) reset() {
	p.mu.Lock()
	p.pings, p.others = 0, 0
	p.mu.Unlock()
}

// packetTap splits one connection's stream into frames.
type packetTap struct {
	p         *packets
	buf       []byte
	connected bool // the connect request went by
}

func (t *packetTap) Write(b []byte) (int, error) {
	now := time.Now()
	t.buf = append(t.buf, b...)
	for len(t.buf) >= 4 {
		n := int(binary.BigEndian.Uint32(t.buf))
		if len(t.buf) < 4+n {
			break
		}
		frame := t.buf[4 : 4+n]
		t.buf = t.buf[4+n:]
		if !t.connected {
			t.connected = true
			t.p.mu.Lock()
			t.p.conns++
			t.p.mu.Unlock()
			continue
		}
		ping := len(frame) >= 8 && int32(binary.BigEndian.Uint32(frame)) == -2 && binary.BigEndian.Uint32(frame[4:]) == 11
		t.p.mu.Lock()
		if ping {
			t.p.pings++
			t.p.lastPing = now
		} else {
			t.p.others++
		}
		t.p.mu.Unlock()
	}
	return len(b), nil
}

// tappedServer returns the address of a proxy to the shared ZooKeeper
// server, and the count of what clients send through it.
func tappedServer(t *testing.T) (string, *packets) {
	t.Helper()
	srv := testserver.SharedZooKeeper(t)
	proxy := testserver.StartProxy(t, srv.Addr())
	seen := new(packets)
	proxy.TapClient(seen.newTap)
	return proxy.Addr(), seen
}

// TestPingsOnlyWhenIdle: a connection dialed through a SessionProbe sends
// the client's pings while nothing else flows, none while other requests
// do (here a sync every 250 ms at a session timeout of 2 s), and the
// session lives on through both on one connection: over three session
// timeouts with syncs alone, it neither expires nor has its connection
// dropped for want of a reply.
func TestPingsOnlyWhenIdle(t *testing.T) {
	addr, seen := tappedServer(t)
	const timeout = 2 * time.Second
	probe := zookeeper.NewSessionProbe(nil)
	conn, _, err := zk.Connect([]string{addr}, timeout, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if _, _, err := conn.Exists("/"); err != nil {
		t.Fatal(err)
	}
	sid := conn.SessionID()
	if got, ok := probe.Negotiated(sid); !ok || got != timeout {
		t.Fatalf("negotiated %s, %v; want %s", got, ok, timeout)
	}

	// Idle: the client pings.
	testkit.Eventually(t, 10*timeout, "pings on an idle connection", func() bool {
		_, pings, _ := seen.counts()
		return pings >= 2
	})

	// Busy with syncs for three session timeouts: no ping goes.
	seen.reset()
	for end := time.Now().Add(3 * timeout); time.Now().Before(end); {
		if _, err := conn.Sync("/"); err != nil {
			t.Fatalf("sync: %v", err)
		}
		time.Sleep(250 * time.Millisecond) // the request rate under test, not synchronisation
	}
	conns, pings, others := seen.counts()
	if pings != 0 || others < 12 {
		t.Errorf("while syncs flowed: %d pings, %d other requests; want no ping, and the syncs", pings, others)
	}
	if conns != 1 || conn.SessionID() != sid || conn.State() != zk.StateHasSession {
		t.Errorf("after syncs alone for %s: %d connections, session 0x%x (was 0x%x), state %s; want the same session on one connection",
			3*timeout, conns, conn.SessionID(), sid, conn.State())
	}

	// Idle again: pings resume, on the same connection and session.
	seen.reset()
	testkit.Eventually(t, 10*timeout, "pings once the syncs stopped", func() bool {
		_, pings, _ := seen.counts()
		return pings >= 2
	})
	if _, _, err := conn.Exists("/"); err != nil {
		t.Fatal(err)
	}
	if conns, _, _ := seen.counts(); conns != 1 || conn.SessionID() != sid {
		t.Errorf("after idling again: %d connections, session 0x%x (was 0x%x); want one, the same", conns, conn.SessionID(), sid)
	}
}

// TestStandaloneRenewalsRideOnPings: on a standalone server, where every
// request restarts the session's timeout where it expires, a holder's
// renewals ride on the client's own pings, a third of the session timeout
// apart, and send nothing else; its safe-until moves with them and never
// lies beyond the last ping that reached the server plus the timeout less
// the drift margin.
func TestStandaloneRenewalsRideOnPings(t *testing.T) {
	addr, seen := tappedServer(t)
	cfg := backend.Config{TTL: 2 * time.Second}
	b, err := zookeeper.Dial(testkit.Context(t, 30*time.Second), []string{addr}, zookeeper.DialOptions{Options: zookeeper.Options{Config: cfg, Root: uniqueRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CloseAtEnd(t, b, 5*time.Second)
	term := testkit.Campaign(t, b, "ride", "holder")
	standalone, interval, ok := zookeeper.RenewalMode(b)
	if !ok || !standalone || interval != cfg.TTL/3 {
		t.Fatalf("renewals: standalone %v, every %s (live generation: %v); want standalone, every %s", standalone, interval, ok, cfg.TTL/3)
	}

	// The campaign's last requests (the watch on the holder's node) may
	// still be on their way: count from a renewal on.
	first := term.SafeUntil()
	testkit.Eventually(t, 2*cfg.TTL, "a renewal", func() bool { return term.SafeUntil().After(first) })
	seen.reset()
	start := term.SafeUntil()
	time.Sleep(3 * cfg.TTL) // the span measured, not synchronisation
	_, pings, others := seen.counts()
	last := seen.lastPingAt()
	until := term.SafeUntil()
	select {
	case <-term.Done():
		t.Fatalf("the term ended: %v", term.Err())
	default:
	}
	if others != 0 || pings < 6 || pings > 12 {
		t.Errorf("over %s: %d pings and %d other requests; want only the client's pings, one per %s", 3*cfg.TTL, pings, others, interval)
	}
	if !until.After(start.Add(2 * cfg.TTL)) {
		t.Errorf("safe-until moved from %s to %s over %s; want the pings to move it", start.Format("15:04:05.000"), until.Format("15:04:05.000"), 3*cfg.TTL)
	}
	drift := b.Config().DriftMargin
	if bound := last.Add(cfg.TTL - drift); until.After(bound) {
		t.Errorf("safe-until %s lies beyond the last ping to reach the server (%s) plus the timeout less the drift margin (%s)",
			until.Format("15:04:05.000"), last.Format("15:04:05.000"), bound.Format("15:04:05.000"))
	}
}

// TestUnknownModeRenewsAsOnEnsemble: a server whose mode the probe could
// not learn (here the connection for srvr is refused; ZooKeeper itself
// always answers srvr) cannot be told from an ensemble's member, so the
// Backend renews as on one: a sync every RenewInterval, timed with the
// ensemble lag.
func TestUnknownModeRenewsAsOnEnsemble(t *testing.T) {
	addr, seen := tappedServer(t)
	cfg := backend.Config{TTL: 2 * time.Second}
	// Each connection is dialed first, then the one that asks srvr.
	var dials atomic.Int32
	probe := zookeeper.NewSessionProbe(func(network, address string, timeout time.Duration) (net.Conn, error) {
		if dials.Add(1)%2 == 0 {
			return nil, errors.New("refused by the test")
		}
		return net.DialTimeout(network, address, timeout)
	})
	conn, _, err := zk.Connect([]string{addr}, cfg.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	b := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: uniqueRoot(t), Probe: probe})
	testkit.Campaign(t, b, "unknown-mode", "holder")
	if standalone, interval, ok := zookeeper.RenewalMode(b); !ok || standalone || interval != b.Config().RenewInterval {
		t.Fatalf("renewals: standalone %v, every %s (live generation: %v); want syncs every %s", standalone, interval, ok, b.Config().RenewInterval)
	}
	seen.reset()
	testkit.Eventually(t, 10*cfg.TTL, "syncs", func() bool {
		_, _, others := seen.counts()
		return others >= 3
	})
}
