package testserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxyDialTimeout bounds the dial to the target so that a dead target makes
// the client's connection fail rather than hang past Close.
const proxyDialTimeout = 5 * time.Second

// Proxy is a TCP proxy on loopback that can partition its clients from the
// target: give one client the proxy's address and the others the target's,
// and Cut isolates that one client alone.
//
// While cut, the proxy closes the connections it was forwarding and then
// accepts new ones but forwards nothing, in either direction. Closing makes
// the cut take effect at once, with no in-flight bytes slipping through;
// holding new connections open (instead of refusing them) is what a real
// partition looks like to a client: its dials and requests time out, rather
// than failing fast with "connection refused", which clients treat as the
// server being down and retry differently.
//
// SetLatency makes the link slow instead: every byte is delivered, in order,
// a fixed time after the proxy read it.
type Proxy struct {
	ln     net.Listener
	ctx    context.Context // cancelled by Close, to abort dials in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup

	latency atomic.Int64 // time.Duration added to every byte forwarded

	tap atomic.Pointer[func() io.Writer] // see TapClient

	mu     sync.Mutex
	target string
	cut    bool
	closed bool
	conns  map[net.Conn]struct{} // every open conn, both ends of each pair
}

// NewProxy starts a proxy to target on a random 127.0.0.1 port. The caller
// must Close it.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy to %s: %w", target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ln:     ln,
		target: target,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[net.Conn]struct{}),
	}
	p.wg.Go(p.accept)
	return p, nil
}

// StartProxy starts a proxy to target and closes it when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Addr returns the address clients should dial instead of the target,
// "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut partitions the proxy's clients from the target: established
// connections are closed and new ones are held without forwarding, until
// Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.closeAllLocked()
}

// Heal ends a Cut. Connections held during the cut are closed, because they
// never reached the target and their clients would otherwise wait for their
// own timeouts before redialling.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return
	}
	p.cut = false
	p.closeAllLocked()
}

// SetLatency delays every byte forwarded, in either direction, by d from
// now on: bytes the proxy reads at time t are written at t+d, in the order
// read, and none is dropped, as over a slow link. It applies to the
// connections already open as well as to new ones; bytes read before the
// call keep the delay they were read with. d <= 0 removes the delay.
//
// Latency combines with Cut, Heal and Retarget: they close connections
// as they do without it, and bytes still waiting out their delay on a
// connection that is closed are dropped with it, as bytes in flight are
// lost when a link is cut. A connection one side closes delivers what it
// had sent before the close, after the delay, and then ends the pair.
func (p *Proxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
}

// TapClient makes the proxy copy what clients send to the target: for
// each connection it forwards from now on, it calls newTap once and writes
// everything that client sends, in order, to the writer returned, before
// forwarding it. A writer that is an io.Closer is closed when its
// connection ends. Writes happen on the connection's forwarding goroutine:
// a slow writer slows that client down, and an error from it is ignored.
// It lets a test count a client's requests as the server receives them.
// newTap nil stops tapping new connections.
func (p *Proxy) TapClient(newTap func() io.Writer) {
	if newTap == nil {
		p.tap.Store(nil)
		return
	}
	p.tap.Store(&newTap)
}

// Retarget sends the proxy's new connections to target from now on, and
// closes the connections it was forwarding, as a server restarted at the
// proxy's address would: clients keep their address for a server that
// came back elsewhere (a restarted test server gets a new port).
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	p.closeAllLocked()
}

// Close stops the proxy, closes every connection and waits for all of its
// goroutines. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.cancel()
		p.ln.Close()
		p.closeAllLocked()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, typically: back off like net/http
			// does rather than spin, as the condition may clear.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		switch {
		case p.closed:
			c.Close()
		case p.cut:
			p.conns[c] = struct{}{}
			p.wg.Go(func() { p.hold(c) })
		default:
			p.conns[c] = struct{}{}
			p.wg.Go(func() { p.forward(c) })
		}
		p.mu.Unlock()
	}
}

// hold swallows what the client sends, so its writes do not block on a full
// socket buffer, and frees the conn as soon as the client gives up.
func (p *Proxy) hold(c net.Conn) {
	_, _ = io.Copy(io.Discard, c)
	p.drop(c)
}

func (p *Proxy) forward(c net.Conn) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(p.ctx, proxyDialTimeout)
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	up, err := d.DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		p.drop(c)
		return
	}

	p.mu.Lock()
	if _, open := p.conns[c]; !open {
		// Cut, Heal or Close ran during the dial and already closed c.
		p.mu.Unlock()
		up.Close()
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()

	// Either direction ending ends the pair: a half-open connection through
	// a proxy is not something tests want to reason about.
	var pair sync.WaitGroup
	var tap io.Writer
	if newTap := p.tap.Load(); newTap != nil {
		tap = (*newTap)()
	}
	pair.Go(func() {
		p.pipe(up, c, tap)
		if cl, ok := tap.(io.Closer); ok {
			cl.Close()
		}
		p.drop(c)
		p.drop(up)
	})
	pair.Go(func() { p.pipe(c, up, nil); p.drop(c); p.drop(up) })
	pair.Wait()
}

// pipeBuf is the most a pipe reads at once, as io.Copy does.
const pipeBuf = 32 << 10

// pipeQueue is how many reads a pipe holds while they wait out the
// latency. A full queue stops the pipe reading, so that a sender faster than
// the link is slowed by TCP flow control rather than buffered without end.
const pipeQueue = 64

// chunk is what one read from a connection returned, and when it is due at
// the other end.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst until src ends, holding each read back until the
// latency at the time of the read has passed. Reads are written in order,
// so one read late behind a longer delay holds back the reads after it.
// What src sent before ending is delivered; a src or dst closed by the
// proxy (Cut, Heal, Retarget, Close, or the other direction ending) drops
// what is still waiting. Each read is also written to tap, if not nil.
func (p *Proxy) pipe(dst, src net.Conn, tap io.Writer) {
	queue := make(chan chunk, pipeQueue)
	abort := make(chan struct{})      // closed when the proxy closed src
	writerDone := make(chan struct{}) // closed when the writer returns
	go func() {
		defer close(writerDone)
		var timer *time.Timer
		for ch := range queue {
			if wait := time.Until(ch.due); wait > 0 {
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				select {
				case <-timer.C:
				case <-abort:
					timer.Stop()
					return
				case <-p.ctx.Done():
					timer.Stop()
					return
				}
			}
			if _, err := dst.Write(ch.b); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, pipeBuf)
read:
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if tap != nil {
				_, _ = tap.Write(buf[:n])
			}
			ch := chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.latency.Load()))}
			select {
			case queue <- ch:
			case <-writerDone:
				// dst failed: nothing more can be delivered.
				break read
			case <-p.ctx.Done():
				// Close: the writer stops too, without waiting out delays.
				break read
			}
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				close(abort)
			}
			break
		}
	}
	close(queue)
	<-writerDone
}

// drop closes c and forgets it; closing twice is harmless for net.Conn.
func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) closeAllLocked() {
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}
