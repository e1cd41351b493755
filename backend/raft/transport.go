package raft

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	hraft "github.com/hashicorp/raft"
)

// One TCP port carries both raft's own RPCs and the group API (join,
// forwarded commands, renewals, reads), as Consul's server port does: after
// the TLS handshake the dialer sends one byte naming the protocol.
const (
	protoRaft byte = 'R'
	protoAPI  byte = 'A'
)

// mux accepts TLS connections and sorts them by their first byte.
type mux struct {
	gate *gate
	ln   net.Listener
	tls  *tls.Config
	raft *chanListener
	api  *chanListener
	wg   sync.WaitGroup
}

func newMux(ln net.Listener, cfg *tls.Config, g *gate) *mux {
	m := &mux{gate: g, ln: ln, tls: cfg, raft: newChanListener(ln.Addr()), api: newChanListener(ln.Addr())}
	m.wg.Add(1)
	go m.accept()
	return m
}

func (m *mux) accept() {
	defer m.wg.Done()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.raft.close()
			m.api.close()
			return
		}
		go m.sort(c)
	}
}

// sort finishes the handshake and hands c to the listener its first byte
// names. A peer that stalls is dropped after a few seconds, so that it
// cannot hold a goroutine forever.
func (m *mux) sort(c net.Conn) {
	c, err := m.gate.track(c)
	if err != nil {
		return
	}
	tc := tls.Server(c, m.tls)
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if err := tc.Handshake(); err != nil {
		c.Close()
		return
	}
	if _, err := tc.Read(b[:]); err != nil {
		c.Close()
		return
	}
	_ = tc.SetDeadline(time.Time{})
	switch b[0] {
	case protoRaft:
		m.raft.put(tc)
	case protoAPI:
		m.api.put(tc)
	default:
		c.Close()
	}
}

func (m *mux) close() error {
	err := m.ln.Close()
	m.wg.Wait()
	return err
}

// dialProto opens a TLS connection to addr and announces proto.
func dialProto(ctx context.Context, cfg *tls.Config, g *gate, addr string, proto byte) (net.Conn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if raw, err = g.track(raw); err != nil {
		return nil, err
	}
	c := tls.Client(raw, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
	}
	if _, err := c.Write([]byte{proto}); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// chanListener is a net.Listener fed by the mux.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) put(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) close() { l.once.Do(func() { close(l.done) }) }

func (l *chanListener) Close() error { l.close(); return nil }

func (l *chanListener) Addr() net.Addr { return l.addr }

// streamLayer is raft's transport over the mux.
type streamLayer struct {
	*chanListener
	gate      *gate
	tls       *tls.Config
	advertise net.Addr
}

var _ hraft.StreamLayer = (*streamLayer)(nil)

func (s *streamLayer) Dial(addr hraft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := dialProto(ctx, s.tls, s.gate, string(addr), protoRaft)
	if err != nil {
		return nil, fmt.Errorf("raft: dial %s: %w", addr, err)
	}
	return c, nil
}

// Addr is the address peers reach us at, which raft puts in its RPCs.
func (s *streamLayer) Addr() net.Addr { return s.advertise }
