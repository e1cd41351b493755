package zookeeper_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// sessionSniffer is a dialer that reads the session ID and password from
// the server's replies to the client's connect requests, so that a test
// can take the session over and close it, as ZooKeeper lets any client
// holding both do.
type sessionSniffer struct {
	mu     sync.Mutex
	id     int64
	passwd []byte
}

func (s *sessionSniffer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &sniffedConn{Conn: c, s: s}, nil
}

// session returns the latest session granted.
func (s *sessionSniffer) session() (int64, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id, s.passwd
}

type sniffedConn struct {
	net.Conn
	s    *sessionSniffer
	head []byte // the connection's first bytes, until the first frame is whole
	done bool
}

// Read passes what it reads on, and parses the first frame as a connect
// response: protocolVersion int32, timeOut int32, sessionId int64, passwd
// (int32 length, 16 bytes), readOnly bool (from 3.4 on).
func (c *sniffedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done {
		c.head = append(c.head, p[:n]...)
		if len(c.head) >= 4 {
			size := int(binary.BigEndian.Uint32(c.head))
			if len(c.head) >= 4+size {
				c.done = true
				body := c.head[4 : 4+size]
				if (size == 36 || size == 37) && binary.BigEndian.Uint32(body[16:]) == 16 {
					if id := int64(binary.BigEndian.Uint64(body[8:])); id != 0 {
						c.s.mu.Lock()
						c.s.id, c.s.passwd = id, append([]byte(nil), body[20:36]...)
						c.s.mu.Unlock()
					}
				}
			}
		}
	}
	return n, err
}

// closeSession connects to the server at addr with session id and passwd,
// which moves the session to this connection (the server closes the
// client's), and closes it: the server deletes the session's ephemeral
// nodes, and the client learns on reconnection that its session expired.
func closeSession(t *testing.T, addr string, id int64, passwd []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	frame := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	var req []byte
	req = binary.BigEndian.AppendUint32(req, 0)    // protocolVersion
	req = binary.BigEndian.AppendUint64(req, 0)    // lastZxidSeen
	req = binary.BigEndian.AppendUint32(req, 4000) // timeOut, ms
	req = binary.BigEndian.AppendUint64(req, uint64(id))
	req = binary.BigEndian.AppendUint32(req, uint32(len(passwd)))
	req = append(req, passwd...)
	read := func() []byte {
		var size [4]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			t.Fatalf("session 0x%x: read reply: %v", id, err)
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatalf("session 0x%x: read reply: %v", id, err)
		}
		return body
	}
	if _, err := c.Write(frame(req)); err != nil {
		t.Fatal(err)
	}
	if resp := read(); len(resp) < 16 || int64(binary.BigEndian.Uint64(resp[8:])) != id {
		t.Fatalf("the server did not give session 0x%x to a connection with its password", id)
	}
	xid, opCloseSession := int32(1), int32(-11)
	if _, err := c.Write(frame(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(xid)), uint32(opCloseSession)))); err != nil {
		t.Fatal(err)
	}
	if resp := read(); len(resp) < 16 || binary.BigEndian.Uint32(resp[12:]) != 0 {
		t.Fatalf("closeSession of 0x%x refused: % x", id, resp)
	}
}

// TestSessionExpiryEndsHeldTermsAtOnce: when the server ends the session
// while the holder's client is connected, every held term ends with
// ErrLeaseLost once the client hears of it, before its safe-until (which
// would end it with ErrExpired): the client drops every watch with an
// EventNotWatching carrying zk.ErrSessionExpired as it reconnects, which
// ends the terms at once; the Backend's next renewal, which finds the
// client on another session, would end them too.
func TestSessionExpiryEndsHeldTermsAtOnce(t *testing.T) {
	srv := testserver.SharedZooKeeper(t)
	cfg := backend.Config{TTL: 20 * time.Second}
	for _, mode := range []string{"Watches", "goroutine"} {
		t.Run(mode, func(t *testing.T) {
			sniff := &sessionSniffer{}
			probe := zookeeper.NewSessionProbe(sniff.dial)
			w := zookeeper.NewWatches()
			conn, _, err := zk.Connect([]string{srv.Addr()}, cfg.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}), zk.WithEventCallback(w.Callback))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(conn.Close)
			opts := zookeeper.Options{Config: cfg, Root: uniqueRoot(t), Probe: probe}
			if mode == "Watches" {
				opts.Watches = w
			}
			b := newBackendAsIs(t, conn, opts)
			const n = 20
			terms := make([]baton.Term, n)
			for i := range n {
				terms[i] = testkit.CampaignWithin(t, b, fmt.Sprintf("expiring-%d", i), "a", 10*time.Second)
			}
			id, passwd := sniff.session()
			if id != conn.SessionID() {
				t.Fatalf("sniffed session 0x%x, the client has 0x%x", id, conn.SessionID())
			}
			closeSession(t, srv.Addr(), id, passwd)
			for _, term := range terms {
				testkit.WaitDone(t, term, cfg.TTL)
				if !errors.Is(term.Err(), baton.ErrLeaseLost) {
					t.Errorf("after the session was closed on the server, Err() = %v, want ErrLeaseLost", term.Err())
				}
			}
			t.Logf("first term's end: %v", terms[0].Err())
		})
	}
}
