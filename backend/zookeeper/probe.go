package zookeeper

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// SessionProbe learns the session timeout ZooKeeper negotiated for a
// connection, which go-zookeeper uses but does not expose. The server
// clamps the timeout a client asks for into [minSessionTimeout,
// maxSessionTimeout] (by default 2 to 20 ticks, 4 s to 40 s), and expires
// a session that long after it last heard from the client: a holder that
// timed its safe-until by a TTL longer than the negotiated timeout could
// still act after the server had handed its lease on.
//
// Pass Dial to zk.Connect with zk.WithDialer, and the probe to New in
// Options.Probe; Dial (this package's) does both for you. A SessionProbe is
// safe for concurrent use; use one per connection.
type SessionProbe struct {
	base zk.Dialer

	mu      sync.Mutex
	session int64
	timeout time.Duration
}

// NewSessionProbe returns a probe that dials through base, or through
// net.DialTimeout when base is nil.
func NewSessionProbe(base zk.Dialer) *SessionProbe {
	if base == nil {
		base = net.DialTimeout
	}
	return &SessionProbe{base: base}
}

// Dial is a zk.Dialer: it dials through the probe's base dialer and reads
// the session ID and timeout from the server's reply to the connect request
// as the client receives it.
func (p *SessionProbe) Dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := p.base(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return &probeConn{Conn: c, probe: p}, nil
}

// Negotiated returns the session timeout the server granted to session,
// and false when the probe has not seen that session being granted or
// renewed on a connection.
func (p *SessionProbe) Negotiated(session int64) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if session == 0 || session != p.session {
		return 0, false
	}
	return p.timeout, true
}

func (p *SessionProbe) record(session int64, timeout time.Duration) {
	p.mu.Lock()
	p.session, p.timeout = session, timeout
	p.mu.Unlock()
}

// connectReplyLen is how much of a connection's first bytes the probe
// reads: the frame length (4 bytes) and, of the ConnectResponse, the
// protocol version (4), the timeout in milliseconds (4) and the session ID
// (8). The password and read-only flag that follow do not matter here.
const connectReplyLen = 4 + 4 + 4 + 8

// probeConn copies the first connectReplyLen bytes the client reads, and
// parses them once it has them all. The client reads from one goroutine at
// a time, so the head needs no lock.
type probeConn struct {
	net.Conn
	probe *SessionProbe
	head  []byte
	done  bool
}

func (c *probeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.done && n > 0 {
		c.head = append(c.head, b[:min(n, connectReplyLen-len(c.head))]...)
		if len(c.head) == connectReplyLen {
			c.done = true
			timeoutMs := int32(binary.BigEndian.Uint32(c.head[8:12]))
			session := int64(binary.BigEndian.Uint64(c.head[12:20]))
			// Session 0 is the server's way of saying the session expired.
			if session != 0 && timeoutMs > 0 {
				c.probe.record(session, time.Duration(timeoutMs)*time.Millisecond)
			}
			c.head = nil
		}
	}
	return n, err
}
