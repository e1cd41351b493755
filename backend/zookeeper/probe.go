package zookeeper

import (
	"bytes"
	"encoding/binary"
	"net"
	"slices"
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
// The probe also sees which requests the server answered, and when the
// client sent them, pings included (go-zookeeper ignores their replies);
// and it asks each server it dials, with the four-letter word srvr, whether
// it runs standalone. On a standalone
// server every request, a ping too, restarts the session's timeout where
// the session expires, so the Backend's renewals can ride on the client's
// own pings (see Options.Config).
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
	// conn is the connection that carries session, and seq counts the
	// connections that carried a session, so that a caller can tell
	// whether the client reconnected between two looks.
	conn *probeConn
	seq  uint64
	// answered is the send time of the latest request the server answered
	// without error on conn; moved is closed, and replaced, when it moves.
	answered time.Time
	moved    chan struct{}
}

// NewSessionProbe returns a probe that dials through base, or through
// net.DialTimeout when base is nil.
func NewSessionProbe(base zk.Dialer) *SessionProbe {
	if base == nil {
		base = net.DialTimeout
	}
	return &SessionProbe{base: base, moved: make(chan struct{})}
}

// Dial is a zk.Dialer: it dials through the probe's base dialer and reads
// the session ID and timeout from the server's reply to the connect request
// as the client receives it. Before it returns, it asks the server (on a
// second connection, dialed the same way) whether it runs standalone.
func (p *SessionProbe) Dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := p.base(network, address, timeout)
	if err != nil {
		return nil, err
	}
	pc := &probeConn{Conn: c, probe: p}
	pc.standalone = askStandalone(p.base, network, address, timeout)
	return pc, nil
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

// link is what the probe knows of the connection that carries a session.
type link struct {
	// seq names the connection: it changes when the client reconnects.
	seq uint64
	// standalone says the server runs standalone (srvr said so when the
	// connection was dialed).
	standalone bool
	// answered is the send time of the latest request the server answered
	// without error on the connection; zero before the first.
	answered time.Time
	// moved is closed when answered moves or the connection changes.
	moved <-chan struct{}
}

// link returns what the probe knows of the connection carrying session,
// and false when session is not the one the probe saw granted last.
func (p *SessionProbe) link(session int64) (link, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if session == 0 || session != p.session || p.conn == nil {
		return link{moved: p.moved}, false
	}
	return link{seq: p.seq, standalone: p.conn.standalone, answered: p.answered, moved: p.moved}, true
}

// record makes c, on which the server granted session for timeout, the
// probe's connection.
func (p *SessionProbe) record(c *probeConn, session int64, timeout time.Duration) {
	p.mu.Lock()
	p.session, p.timeout = session, timeout
	p.conn, p.answered = c, time.Time{}
	p.seq++
	close(p.moved)
	p.moved = make(chan struct{})
	p.mu.Unlock()
}

// answer records that the server answered, without error, a request that
// the client sent on c at sent.
func (p *SessionProbe) answer(c *probeConn, sent time.Time) {
	p.mu.Lock()
	if p.conn == c && sent.After(p.answered) {
		p.answered = sent
		close(p.moved)
		p.moved = make(chan struct{})
	}
	p.mu.Unlock()
}

// probeConn splits what the client writes and reads into frames (a 4-byte
// length, then the body). The first frame each way is the connect request
// and the server's reply to it, which names the session and its timeout;
// every later frame the client writes is a request, and the server
// answers requests in the order it received them, between watch events.
// The probe pairs each answer with its request's send time, by xid. It drops the
// client's pings while other requests flow (see Write).
type probeConn struct {
	net.Conn
	probe *SessionProbe
	// standalone says the server answered srvr with "Mode: standalone".
	standalone bool

	// in splits the server's frames; the client reads from one goroutine
	// at a time, so it needs no lock.
	in frames

	// mu guards out, the client's frames, and sent, the send times of the
	// requests not answered yet, oldest first: the client writes from one
	// goroutine at a time, but another than it reads from.
	mu   sync.Mutex
	out  frames
	sent []request

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
// its reply, 2/9 of the session timeout. The Backend's renewals on an
// ensemble (a sync every TTL/6 by default) come well within it, so its
// pings all drop.
const quietPings = 2.0 / 3

// Write passes b on, unless b is a ping and the client wrote another
// request within quietPings of a ping interval: the server heard from the
// session since, and the client would ignore the ping's reply. Such a
// ping is reported as written.
func (c *probeConn) Write(b []byte) (int, error) {
	sent := time.Now()
	now := int64(sent.Sub(writeClock))
	if !bytes.Equal(b, pingPacket) {
		c.lastWrite.Store(now)
	} else if timeout, last := c.timeout.Load(), c.lastWrite.Load(); timeout > 0 && last > 0 && float64(now-last) < quietPings*float64(timeout/3) {
		return len(b), nil
	}
	// Queued before the write, so that no reply can come first; the client
	// writes from one goroutine at a time, so the queue keeps the order in
	// which the requests go out. A write that fails ends the connection.
	c.mu.Lock()
	c.out.feed(b, func(first bool, head []byte) {
		if !first && len(head) >= 4 {
			c.sent = append(c.sent, request{xid: int32(binary.BigEndian.Uint32(head)), at: sent})
		}
	})
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *probeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.feed(b[:n], c.frameIn)
	return n, err
}

// frameIn handles a frame from the server: the reply to the connect
// request first, then replies and watch events.
func (c *probeConn) frameIn(first bool, head []byte) {
	if first {
		// protocol version (4), timeout in milliseconds (4), session ID (8).
		if len(head) < 16 {
			return
		}
		timeoutMs := int32(binary.BigEndian.Uint32(head[4:8]))
		session := int64(binary.BigEndian.Uint64(head[8:16]))
		// Session 0 is the server's way of saying the session expired.
		if session != 0 && timeoutMs > 0 {
			c.timeout.Store(int64(time.Duration(timeoutMs) * time.Millisecond))
			c.probe.record(c, session, time.Duration(timeoutMs)*time.Millisecond)
		}
		return
	}
	// A reply header: xid (4), zxid (8), error code (4). Watch events
	// have xid -1 and answer no request.
	if len(head) < 16 || int32(binary.BigEndian.Uint32(head[0:4])) == -1 {
		return
	}
	xid := int32(binary.BigEndian.Uint32(head[0:4]))
	c.mu.Lock()
	i := slices.IndexFunc(c.sent, func(r request) bool { return r.xid == xid })
	if i < 0 {
		c.mu.Unlock()
		return // a reply to nothing sent: nothing to learn from it
	}
	// Requests queued before it were answered first, or never will be.
	sent := c.sent[i].at
	c.sent = c.sent[i+1:]
	c.mu.Unlock()
	if int32(binary.BigEndian.Uint32(head[12:16])) == 0 {
		c.probe.answer(c, sent)
	}
}

// request is a request the client sent: its xid (-2 for pings) and when.
type request struct {
	xid int32
	at  time.Time
}

// frameHead is how much of each frame's body the probe keeps: the
// connect reply's version, timeout and session ID, or a reply's header.
const frameHead = 16

// frames splits a stream into ZooKeeper's frames, a 4-byte big-endian
// length and that many bytes of body, and hands on the first frameHead
// bytes of each body.
type frames struct {
	n     int // frames seen whole
	size  [4]byte
	sized int    // bytes of size read for the current frame
	left  int    // bytes of the current body still to come
	head  []byte // the current body's first bytes
}

// feed consumes b and calls frame for each frame it completes, with
// first true for the stream's first frame.
func (f *frames) feed(b []byte, frame func(first bool, head []byte)) {
	for len(b) > 0 {
		if f.sized < 4 {
			k := copy(f.size[f.sized:], b)
			f.sized += k
			b = b[k:]
			if f.sized < 4 {
				return
			}
			f.left = int(binary.BigEndian.Uint32(f.size[:]))
			f.head = f.head[:0]
			if f.left > 0 {
				continue
			}
		} else {
			k := min(len(b), f.left)
			if keep := min(k, frameHead-len(f.head)); keep > 0 {
				f.head = append(f.head, b[:keep]...)
			}
			f.left -= k
			b = b[k:]
			if f.left > 0 {
				return
			}
		}
		f.sized = 0
		frame(f.n == 0, f.head)
		f.n++
	}
}
