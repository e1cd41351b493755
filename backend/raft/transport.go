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
// the TLS handshake the dialer sends one byte naming the protocol, with its
// proof of the group's secret (auth.go).
const (
	protoRaft byte = 'R'
	protoAPI  byte = 'A'
)

// mux accepts TLS connections, checks that each proves the group's secret,
// and sorts them by protocol.
type mux struct {
	gate     *gate
	ln       net.Listener
	creds    *creds
	inGroup  func() bool
	refusals *refusalLog
	timeout  time.Duration // for the handshake and the proofs
	raft     *chanListener
	api      *chanListener
	wg       sync.WaitGroup
	// pending holds a slot for each connection that has not yet proved
	// the secret: a flood of unproven connections is dropped at the door
	// instead of costing a goroutine, a file descriptor and a TLS
	// handshake each.
	pending chan struct{}
}

// maxPendingHandshakes bounds the connections a member handshakes with at
// once. Members open a handful each; more than this is a flood.
const maxPendingHandshakes = 256

// newMux serves ln. inGroup reports whether this member is in a group with
// a leader; refused peers are told so.
func newMux(ln net.Listener, cr *creds, g *gate, inGroup func() bool, refusals *refusalLog) *mux {
	m := &mux{
		gate: g, ln: ln, creds: cr, inGroup: inGroup, refusals: refusals, timeout: handshakeTimeout,
		raft: newChanListener(ln.Addr()), api: newChanListener(ln.Addr()),
	}
	m.start()
	return m
}

func (m *mux) start() {
	m.pending = make(chan struct{}, maxPendingHandshakes)
	m.wg.Add(1)
	go m.accept()
}

// accept serves until the listener is closed. Any other accept error (out
// of file descriptors, say) is waited out with a growing pause, as
// net/http's server does: giving up would leave the member running but
// deaf to its group for good.
func (m *mux) accept() {
	defer m.wg.Done()
	var pause time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				m.raft.close()
				m.api.close()
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			m.refusals.log.Warn("accepting a connection failed; retrying", "err", err, "retry_in", pause)
			time.Sleep(pause)
			continue
		}
		pause = 0
		select {
		case m.pending <- struct{}{}:
		default:
			_ = c.Close() // a flood of unproven connections
			continue
		}
		go func() {
			defer func() { <-m.pending }()
			m.sort(c)
		}()
	}
}

// sort finishes the TLS handshake, checks the dialer's proof of the
// secret, and hands c to the listener of the protocol it proved it for. A
// peer that stalls is dropped after m.timeout, so that it cannot hold a
// goroutine for long; every failure is logged with the peer's address.
func (m *mux) sort(c net.Conn) {
	peer := c.RemoteAddr().String()
	c, err := m.gate.track(c)
	if err != nil {
		return
	}
	pc := m.creds.wrap(c)
	tc := tls.Server(pc, m.creds.tlsConfig())
	_ = tc.SetDeadline(time.Now().Add(m.timeout))
	proto, key, err := m.handshake(tc)
	if err != nil {
		c.Close()
		m.refusals.warn(refusalMessage(err), peer, err)
		return
	}
	if !m.creds.prove(pc, key) {
		return // the secret it proved was retired meanwhile
	}
	_ = tc.SetDeadline(time.Time{})
	switch proto {
	case protoRaft:
		m.raft.put(tc)
	case protoAPI:
		m.api.put(tc)
	}
}

func (m *mux) handshake(tc *tls.Conn) (byte, connKey, error) {
	if err := tc.Handshake(); err != nil {
		return 0, nil, tlsHandshakeError{err}
	}
	return acceptAny(tc, m.creds.connKeys(), m.inGroup)
}

func (m *mux) close() error {
	err := m.ln.Close()
	m.wg.Wait()
	return err
}

// dialProto opens a TLS connection to addr, proves the group's secret for
// proto and checks the peer's proof. It proves the first of cr's secrets,
// and when the peer refuses it, each of the others in turn on a new
// connection: during a rotation the peer may hold only the old secret or
// only the new. The handshake gives up at ctx's end or after
// handshakeTimeout, whichever comes first; a refusal of every secret is a
// *refusedError (errors.Is ErrSecretRefused).
func dialProto(ctx context.Context, cr *creds, g *gate, addr string, proto byte) (net.Conn, error) {
	cfg := cr.tlsConfig()
	keys := cr.connKeys()
	for i, key := range keys {
		c, err := dialKey(ctx, cr, cfg, g, key, addr, proto)
		var re *refusedError
		if err != nil && errors.As(err, &re) && i < len(keys)-1 && ctx.Err() == nil {
			continue
		}
		return c, err
	}
	return nil, errors.New("raft: this member holds no secret") // NodeOptions.fill rules it out
}

// dialKey is dialProto with one key, a key of cr.
func dialKey(ctx context.Context, cr *creds, cfg *tls.Config, g *gate, key connKey, addr string, proto byte) (net.Conn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if raw, err = g.track(raw); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(handshakeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = raw.SetDeadline(deadline)
	// The proofs are plain reads and writes: a cancelled ctx ends them by
	// moving the deadline.
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	pc := cr.wrap(raw)
	c := tls.Client(pc, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	if err := key.dial(c, proto); err != nil {
		raw.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, err
	}
	if !stop() {
		// ctx ended as the handshake finished: its deadline may be set.
		raw.Close()
		return nil, ctx.Err()
	}
	if !cr.prove(pc, key) {
		return nil, errors.New("raft: the secret this member proved was retired as it connected")
	}
	_ = raw.SetDeadline(time.Time{})
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
	creds     *creds
	advertise net.Addr
}

var _ hraft.StreamLayer = (*streamLayer)(nil)

func (s *streamLayer) Dial(addr hraft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := dialProto(ctx, s.creds, s.gate, string(addr), protoRaft)
	if err != nil {
		return nil, fmt.Errorf("raft: dial %s: %w", addr, err)
	}
	return c, nil
}

// Addr is the address peers reach us at, which raft puts in its RPCs.
func (s *streamLayer) Addr() net.Addr { return s.advertise }
