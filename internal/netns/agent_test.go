//go:build linux

package netns

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test process runs in the root namespace, which must never send to a
// host's address. So the tests re-run their own binary inside each host as
// an agent: TestHelperProcess, switched on by agentEnv, listens on the
// host's address with an echo server and dials other hosts when told to on
// stdin.
//
// Protocol: the agent prints "ready ADDR" once listening, then answers each
// stdin line with one JSON array of results, each "ok", "timeout" or
// "error: ...":
//
//	dial ADDR/TIMEOUT ...  dials each ADDR (concurrently), sends a line and
//	                       waits for its echo, all within TIMEOUT
//	open ADDR              opens a connection and keeps it
//	ping TIMEOUT           sends a line on the kept connection and waits
//	                       for its echo
//
// The agent exits when its stdin closes.
const agentEnv = "BATON_NETNS_TEST_AGENT"

// agentPort is the port every agent listens on. Each host has its own stack,
// so a fixed port cannot collide with anything.
const agentPort = 7000

const (
	// agentStartTimeout bounds how long an agent takes to print "ready":
	// a race-enabled test binary starting on a loaded CI machine.
	agentStartTimeout = 30 * time.Second

	// replySlack is how much longer than the slowest dial of a request the
	// test waits for the agent's reply.
	replySlack = 30 * time.Second
)

func TestHelperProcess(t *testing.T) {
	addr := os.Getenv(agentEnv)
	if addr == "" {
		t.Skip("the agent the namespace tests run inside hosts; not a test by itself")
	}
	if err := runAgent(addr, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
	// Exit before the testing package prints PASS on the protocol stream.
	os.Exit(0)
}

// runAgent is the agent's main loop.
func runAgent(addr string, stdin io.Reader, stdout io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { serveEcho(ln) })
	// Closing the listener makes serveEcho return, which Wait needs.
	defer ln.Close()

	fmt.Fprintln(stdout, "ready", ln.Addr())
	var kept *echoConn
	defer func() {
		if kept != nil {
			kept.Close()
		}
	}()
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var results []string
		switch {
		case f[0] == "dial":
			results = make([]string, len(f)-1)
			var dials sync.WaitGroup
			for i, arg := range f[1:] {
				dials.Go(func() { results[i] = dialOnce(arg) })
			}
			dials.Wait()
		case f[0] == "open" && len(f) == 2:
			if kept != nil {
				kept.Close()
				kept = nil
			}
			c, err := net.DialTimeout("tcp", f[1], 10*time.Second)
			results = []string{describe(err)}
			if err == nil {
				kept = &echoConn{Conn: c, r: bufio.NewReader(c)}
			}
		case f[0] == "ping" && len(f) == 2 && kept != nil:
			timeout, err := time.ParseDuration(f[1])
			if err != nil {
				return err
			}
			results = []string{kept.roundTrip(timeout)}
		default:
			return fmt.Errorf("bad command %q", sc.Text())
		}
		line, err := json.Marshal(results)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(stdout, "%s\n", line); err != nil {
			return err
		}
	}
	return sc.Err()
}

// dialOnce does one "ADDR/TIMEOUT" of a dial command.
func dialOnce(arg string) string {
	addr, t, ok := strings.Cut(arg, "/")
	timeout, err := time.ParseDuration(t)
	if !ok || err != nil {
		return fmt.Sprintf("error: bad target %q", arg)
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return describe(err)
	}
	ec := &echoConn{Conn: c, r: bufio.NewReader(c)}
	defer ec.Close()
	return ec.roundTrip(timeout)
}

// echoConn is a connection to an agent's echo server.
type echoConn struct {
	net.Conn
	r *bufio.Reader
}

// roundTrip sends a line and waits for it to come back.
func (c *echoConn) roundTrip(timeout time.Duration) string {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return describe(err)
	}
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return describe(err)
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return describe(err)
	}
	if line != "ping\n" {
		return fmt.Sprintf("error: echo %q", line)
	}
	return "ok"
}

// serveEcho echoes every line sent to it until ln is closed, then closes
// the connections it still has and waits for their goroutines.
func serveEcho(ln net.Listener) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			mu.Lock()
			for c := range conns {
				c.Close()
			}
			mu.Unlock()
			return
		}
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Go(func() {
			// Copying is echoing: each line comes back as it arrives.
			_, _ = io.Copy(c, c)
			c.Close()
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		})
	}
}

// describe turns a network error into a result.
func describe(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		return "error: " + err.Error()
	}
}

// agent is the test's side of an agent running inside a host.
type agent struct {
	host  *Host
	addr  netip.AddrPort
	stdin io.WriteCloser
	lines chan string   // the agent's stdout; closed at EOF
	done  chan struct{} // closed once the agent has exited
	err   error         // cmd.Wait's result, set before done is closed

	// stderr is written by exec's copying goroutine until the process is
	// waited for, so it is read only after done.
	stderr bytes.Buffer
}

// startAgent starts an agent inside h and waits until it listens. The agent
// is killed when the test ends, if the Net's Close has not killed it before.
func startAgent(t *testing.T, h *Host) *agent {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{
		host:  h,
		addr:  netip.AddrPortFrom(h.IP, agentPort),
		lines: make(chan string, 16),
		done:  make(chan struct{}),
	}
	cmd := h.Command(t.Context(), exe, "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), agentEnv+"="+a.addr.String())
	cmd.Stderr = &a.stderr
	if a.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start agent in %v: %v", h, err)
	}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			a.lines <- sc.Text()
		}
		close(a.lines)
		// Wait closes stdout, so it comes after the last read.
		a.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		// t.Context is cancelled before cleanups run, which kills the
		// agent; it may also have been killed by Close already.
		_ = a.stdin.Close()
		for range a.lines {
		}
		<-a.done
		if t.Failed() && a.stderr.Len() > 0 {
			t.Logf("agent in %v: exit: %v; stderr:\n%s", h, a.err, a.stderr.String())
		}
	})

	deadline := time.After(agentStartTimeout)
	for {
		select {
		case line, ok := <-a.lines:
			if !ok {
				<-a.done
				t.Fatalf("agent in %v exited before listening: %v\n%s", h, a.err, a.stderr.String())
			}
			if strings.HasPrefix(line, "ready ") {
				return a
			}
		case <-deadline:
			t.Fatalf("agent in %v not listening after %v", h, agentStartTimeout)
		}
	}
}

// send writes one command to the agent; recv reads its reply. Sending to
// several agents before receiving lets their dials run concurrently.
func (a *agent) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := io.WriteString(a.stdin, cmd+"\n"); err != nil {
		t.Fatalf("agent in %v: send %q: %v", a.host, cmd, err)
	}
}

func (a *agent) recv(t *testing.T, timeout time.Duration) []string {
	t.Helper()
	select {
	case line, ok := <-a.lines:
		if !ok {
			<-a.done
			t.Fatalf("agent in %v exited: %v\n%s", a.host, a.err, a.stderr.String())
		}
		var results []string
		if err := json.Unmarshal([]byte(line), &results); err != nil {
			t.Fatalf("agent in %v replied %q: %v", a.host, line, err)
		}
		return results
	case <-time.After(timeout + replySlack):
		t.Fatalf("agent in %v: no reply after %v", a.host, timeout+replySlack)
		return nil
	}
}

// call sends one command and returns the reply.
func (a *agent) call(t *testing.T, cmd string, timeout time.Duration) []string {
	t.Helper()
	a.send(t, cmd)
	return a.recv(t, timeout)
}

// exited waits until the agent's process has ended and returns how.
func (a *agent) exited(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-a.done:
		return a.err
	case <-time.After(within):
		t.Fatalf("agent in %v still running after %v", a.host, within)
		return nil
	}
}
