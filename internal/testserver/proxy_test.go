package testserver_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// echoServer is a TCP echo server on loopback that also counts the bytes it
// received, so a test can tell whether bytes reached it.
type echoServer struct {
	ln       net.Listener
	wg       sync.WaitGroup
	mu       sync.Mutex
	received int
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	var conns sync.Map
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, nil)
			e.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					e.mu.Lock()
					e.received += n
					e.mu.Unlock()
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		e.wg.Wait()
	})
	return e
}

func (e *echoServer) Addr() string { return e.ln.Addr().String() }

func (e *echoServer) Received() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.received
}

func dialLines(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c, bufio.NewReader(c)
}

// roundTrip sends line and returns how long its echo took to come back.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read echo of %q: %v", line, err)
	}
	if got != line+"\n" {
		t.Fatalf("echo of %q = %q", line, got)
	}
	return time.Since(start)
}

// SetLatency is a slow link: a round trip through the proxy crosses it
// twice, so it takes at least twice the latency, and every byte arrives,
// in order, on connections opened before the call and after it.
func TestProxyLatency(t *testing.T) {
	const d = 150 * time.Millisecond
	echo := startEcho(t)
	p := testserver.StartProxy(t, echo.Addr())

	before, beforeR := dialLines(t, p.Addr())
	roundTrip(t, before, beforeR, "warm-up")

	p.SetLatency(d)
	after, afterR := dialLines(t, p.Addr())
	for _, conn := range []struct {
		name string
		c    net.Conn
		r    *bufio.Reader
	}{{"connection opened before SetLatency", before, beforeR}, {"connection opened after", after, afterR}} {
		if rtt := roundTrip(t, conn.c, conn.r, "hello"); rtt < 2*d {
			t.Errorf("%s: round trip took %v with latency %v, want at least %v", conn.name, rtt, d, 2*d)
		}
	}

	// Many small writes in a burst: they must come back whole and in order.
	var want bytes.Buffer
	for i := range 500 {
		line := fmt.Sprintf("message %d\n", i)
		want.WriteString(line)
		if _, err := io.WriteString(after, line); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(afterR, got); err != nil {
		t.Fatalf("read the burst back: %v", err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("burst came back altered or reordered:\n%q\nwant\n%q", got, want.Bytes())
	}

	// More than the proxy holds in its queue, written concurrently with
	// the reads: flow control, not loss, must absorb it.
	big := make([]byte, 4<<20)
	_, _ = rand.Read(big)
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() { _, werr = after.Write(big) })
	back := make([]byte, len(big))
	_, rerr := io.ReadFull(afterR, back)
	wg.Wait()
	if werr != nil || rerr != nil {
		t.Fatalf("4 MiB through the slow link: write %v, read %v", werr, rerr)
	}
	if !bytes.Equal(back, big) {
		t.Errorf("4 MiB came back altered")
	}

	// Latency survives a cut: connections opened after Heal are slow too.
	p.Cut()
	p.Heal()
	healed, healedR := dialLines(t, p.Addr())
	if rtt := roundTrip(t, healed, healedR, "after heal"); rtt < 2*d {
		t.Errorf("after Cut and Heal: round trip took %v, want at least %v", rtt, 2*d)
	}

	p.SetLatency(0)
	roundTrip(t, healed, healedR, "fast again")
}

// Bytes still waiting out their delay when the link is cut are lost with
// it, as bytes in flight are: none may reach the server after Cut.
func TestProxyCutDropsDelayedBytes(t *testing.T) {
	echo := startEcho(t)
	p := testserver.StartProxy(t, echo.Addr())
	tap := &tapBuffer{}
	p.TapClient(func() io.Writer { return tap })
	c, r := dialLines(t, p.Addr())
	roundTrip(t, c, r, "warm-up")
	base := echo.Received()

	p.SetLatency(500 * time.Millisecond)
	if _, err := io.WriteString(c, "must not arrive\n"); err != nil {
		t.Fatal(err)
	}
	// Cut once the proxy has read the line (the tap sees what it reads,
	// before it holds it for the delay), so that Cut meets a delayed chunk.
	testkit.Eventually(t, 10*time.Second, "the proxy to read the line", func() bool {
		s, _ := tap.state()
		return strings.HasSuffix(s, "must not arrive\n")
	})
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Errorf("an echo came back through a cut proxy")
	}
	// Absence can only be checked by waiting: past the delay, the line must
	// still not have reached the server.
	time.Sleep(time.Second)
	if got := echo.Received(); got != base {
		t.Errorf("the server received %d bytes after Cut; want none", got-base)
	}
}

// tapBuffer is a tap writer that records what it was given and whether its
// connection ended.
type tapBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	closed bool
}

func (w *tapBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *tapBuffer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	return nil
}

func (w *tapBuffer) state() (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String(), w.closed
}

// TapClient gives each connection a writer of its own, which sees what that
// client sent (and nothing the server sent back) and is closed with it.
func TestProxyTapClient(t *testing.T) {
	echo := startEcho(t)
	p := testserver.StartProxy(t, echo.Addr())
	var mu sync.Mutex
	var taps []*tapBuffer
	p.TapClient(func() io.Writer {
		mu.Lock()
		defer mu.Unlock()
		w := &tapBuffer{}
		taps = append(taps, w)
		return w
	})
	a, ar := dialLines(t, p.Addr())
	b, br := dialLines(t, p.Addr())
	roundTrip(t, a, ar, "from a 1")
	roundTrip(t, b, br, "from b")
	roundTrip(t, a, ar, "from a 2")
	a.Close()

	mu.Lock()
	got := append([]*tapBuffer(nil), taps...)
	mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d taps for 2 connections", len(got))
	}
	want := map[string]bool{"from a 1\nfrom a 2\n": true, "from b\n": true}
	for _, w := range got {
		s, closed := w.state()
		if !want[s] {
			t.Errorf("a tap saw %q; want one connection's own lines, %v", s, want)
		}
		if s == "from a 1\nfrom a 2\n" {
			if !closed && !testkit.Poll(10*time.Second, testkit.PollInterval, func() bool { _, closed = w.state(); return closed }) {
				t.Errorf("the tap of a closed connection was not closed")
			}
		} else if closed {
			t.Errorf("the tap of an open connection was closed")
		}
	}
}
