package zookeeper_test

import (
	"encoding/binary"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// packets counts the requests clients write to a ZooKeeper server, from
// the bytes a testserver.Proxy taps: pings and the rest (the connect
// request, each connection's first frame, is not counted), and the
// connections seen.
type packets struct {
	mu            sync.Mutex
	conns         int
	pings, others int
}

func (p *packets) newTap() io.Writer {
	p.mu.Lock()
	p.conns++
	p.mu.Unlock()
	return &packetTap{p: p}
}

func (p *packets) counts() (conns, pings, others int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns, p.pings, p.others
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
			continue
		}
		ping := len(frame) >= 8 && int32(binary.BigEndian.Uint32(frame)) == -2 && binary.BigEndian.Uint32(frame[4:]) == 11
		t.p.mu.Lock()
		if ping {
			t.p.pings++
		} else {
			t.p.others++
		}
		t.p.mu.Unlock()
	}
	return len(b), nil
}

// TestPingsOnlyWhenIdle: a connection dialed through a SessionProbe sends
// the client's pings while nothing else flows, none while other requests
// do (here a sync every 250 ms at a session timeout of 2 s), and the
// session lives on through both on one connection: over three session
// timeouts with syncs alone, it neither expires nor has its connection
// dropped for want of a reply.
func TestPingsOnlyWhenIdle(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	proxy := testserver.StartProxy(t, srv.Addr())
	var seen packets
	proxy.TapClient(seen.newTap)
	const timeout = 2 * time.Second
	probe := zookeeper.NewSessionProbe(nil)
	conn, _, err := zk.Connect([]string{proxy.Addr()}, timeout, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}))
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
