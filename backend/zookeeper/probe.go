package zookeeper

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
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
//
// A connection dialed through the probe also leaves out the client's
// pings while other requests keep the session alive: go-zookeeper sends a
// ping every third of the session timeout whatever else it sends, while
// the server restarts a session's timeout on every request it receives
// and go-zookeeper ignores the ping's reply. The probe's connection drops
// a ping when the client wrote another request within the last two thirds
// of that interval (see quietPings), so that, as with ZooKeeper's Java
// client, pings go only when the connection is otherwise idle.
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
// a time, so the head needs no lock. It drops the client's pings while
// other requests flow (see Write).
type probeConn struct {
	net.Conn
	probe *SessionProbe
	head  []byte
	done  bool

	// timeout is the session timeout the server granted on this
	// connection, in nanoseconds, 0 before its reply; lastWrite is when
	// the client last wrote a request other than a ping, in nanoseconds
	// since writeClock (monotonic), 0 before the first. Read and Write run on
	// different goroutines.
	timeout   atomic.Int64
	lastWrite atomic.Int64
}

// writeClock is the origin of probeConn.lastWrite: a monotonic clock reading.
var writeClock = time.Now()

// pingPacket is a ping request as go-zookeeper writes it, in one Write:
// the frame length (8), the xid of pings (-2) and the ping opcode (11).
var pingPacket = []byte{0, 0, 0, 8, 0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 11}

// quietPings is the share of go-zookeeper's ping interval (a third of the
// session timeout) within which another request makes a ping redundant.
// go-zookeeper fails a connection that has read nothing for two ping
// intervals: a ping dropped just under this long after the last request
// leaves the next one (a ping interval later) a third of an interval for
// its reply, 2/9 of the session timeout. The Backend's renewals (every
// TTL/6 by default) come well within it, so its pings all drop.
const quietPings = 2.0 / 3

// Write passes b on, unless b is a ping and the client wrote another
// request within quietPings of a ping interval: the server heard from the
// session since, and the client would ignore the ping's reply. Such a
// ping is reported as written.
func (c *probeConn) Write(b []byte) (int, error) {
	now := int64(time.Since(writeClock))
	if !bytes.Equal(b, pingPacket) {
		c.lastWrite.Store(now)
		return c.Conn.Write(b)
	}
	timeout, last := c.timeout.Load(), c.lastWrite.Load()
	if timeout > 0 && last > 0 && float64(now-last) < quietPings*float64(timeout/3) {
		return len(b), nil
	}
	return c.Conn.Write(b)
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
				c.timeout.Store(int64(time.Duration(timeoutMs) * time.Millisecond))
			}
			c.head = nil
		}
	}
	return n, err
}
