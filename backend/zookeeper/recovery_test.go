package zookeeper_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// replyDropper is a dialer that, once armed, loses the server's reply to
// the next latch-node create: the request reaches the server, which makes
// the node, but the client's connection fails before the reply arrives,
// so the client cannot tell whether the create happened. It is what a
// connection cut at the wrong moment does.
type replyDropper struct {
	armed atomic.Bool
	fired atomic.Int32
	after time.Duration // how long replies are swallowed before the connection fails
	// made reports whether the server has made the node. The connection
	// fails only after it has (and after after), so that the test always
	// exercises a create that happened, however loaded the machine.
	made func() bool
}

func (d *replyDropper) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return &droppingConn{Conn: c, d: d}, nil
}

type droppingConn struct {
	net.Conn
	d        *replyDropper
	dropping atomic.Bool
}

func (c *droppingConn) Write(b []byte) (int, error) {
	if !bytes.Contains(b, []byte("-latch-")) || !c.d.armed.CompareAndSwap(true, false) {
		return c.Conn.Write(b)
	}
	// Start swallowing replies before the create goes out: set after the
	// write, the reply could slip through first (it did, on a loaded
	// machine), and the create would simply succeed.
	c.dropping.Store(true)
	c.d.fired.Add(1)
	n, err := c.Conn.Write(b)
	if err == nil {
		go func() {
			if c.d.made != nil {
				testkit.Poll(10*time.Second, testkit.PollInterval, c.d.made)
			}
			time.Sleep(c.d.after)
			c.Conn.Close()
		}()
	}
	return n, err
}

func (c *droppingConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.dropping.Load() {
			return n, err
		}
	}
}

// TestCreateRecoveredAfterLostReply: a create whose reply is lost must be
// resolved by finding the node through its protected prefix, as Curator
// does, not by giving up (the node would linger, and some day lead with
// nobody acting) nor by creating a second node.
func TestCreateRecoveredAfterLostReply(t *testing.T) {
	// Waits out timeouts rather than working: runs beside the others.
	t.Parallel()
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	cfg := backend.Config{TTL: 4 * time.Second}
	d := &replyDropper{after: 300 * time.Millisecond}
	probe := zookeeper.NewSessionProbe(d.dial)
	conn, _, err := zk.Connect([]string{srv.Addr()}, cfg.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	logs := newLogRecorder()
	b := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe, Logger: logs.logger()})
	raw := rawConn(t, srv.Addr())
	// The latch exists, so that the first create is the one that counts.
	mkdirs(t, raw, root+"/recover")
	d.made = func() bool { kids, _, err := raw.Children(root + "/recover"); return err == nil && len(kids) > 0 }
	if _, err := b.Leader(testkit.Context(t, 5*time.Second), "recover"); !errors.Is(err, baton.ErrNoLeader) {
		t.Fatal(err) // also: the session is up before the dropper is armed
	}
	session := conn.SessionID()

	d.armed.Store(true)
	term := testkit.CampaignWithin(t, b, "recover", "x", 10*time.Second)
	if d.fired.Load() != 1 {
		t.Fatalf("the create's reply was not dropped (fired %d times)", d.fired.Load())
	}
	logs.await(t, "found the latch node of a create whose reply was lost", time.Second)
	kids := children(t, raw, root+"/recover")
	if len(kids) != 1 {
		t.Fatalf("latch children %q, want exactly the one node", kids)
	}
	_, stat, err := raw.Get(root + "/recover/" + kids[0])
	if err != nil {
		t.Fatal(err)
	}
	if tokenOf(t, raw, b, stat.Czxid) != term.Token() || stat.EphemeralOwner != session {
		t.Errorf("node czxid %d owner 0x%x; want the term's token %d and the session 0x%x", stat.Czxid, stat.EphemeralOwner, term.Token(), session)
	}
	if conn.SessionID() != session {
		t.Errorf("the client changed session; the test wants a reconnection to the same one")
	}
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestCancelledDuringLostCreateLeavesNoNode: a campaign cancelled while its
// create's outcome is unknown must not leave the node behind once the
// outcome is known; until then, a new campaign for the name waits.
func TestCancelledDuringLostCreateLeavesNoNode(t *testing.T) {
	// Waits out timeouts rather than working: runs beside the others.
	t.Parallel()
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	cfg := backend.Config{TTL: 4 * time.Second}
	d := &replyDropper{after: 1500 * time.Millisecond}
	probe := zookeeper.NewSessionProbe(d.dial)
	conn, _, err := zk.Connect([]string{srv.Addr()}, cfg.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	b := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
	raw := rawConn(t, srv.Addr())
	latch := root + "/abandoned"
	mkdirs(t, raw, latch)
	d.made = func() bool { kids, _, err := raw.Children(latch); return err == nil && len(kids) > 0 }
	if _, err := b.Leader(testkit.Context(t, 5*time.Second), "abandoned"); !errors.Is(err, baton.ErrNoLeader) {
		t.Fatal(err)
	}

	d.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = b.Campaign(ctx, "abandoned", baton.Candidate{ID: "x"})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("campaign cancelled mid-create: err = %v, want DeadlineExceeded", err)
	}
	// The server makes the node in its own time, the more so on a loaded
	// machine; the dropper keeps the connection (and the outcome unknown
	// to the client) until it has.
	testkit.Eventually(t, 10*time.Second, "the server to make the cancelled campaign's node", func() bool {
		return len(children(t, raw, latch)) == 1
	})
	// The same name again: it must wait for the clean-up rather than queue
	// behind its own left-over node.
	again := testkit.CampaignAsync(t, b, "abandoned", "x")
	w := testkit.WaitTerm(t, again, 15*time.Second)
	kids := children(t, raw, latch)
	if len(kids) != 1 {
		t.Fatalf("latch children %q after the new campaign won; want only its node", kids)
	}
	_, stat, err := raw.Get(latch + "/" + kids[0])
	if err != nil || tokenOf(t, raw, b, stat.Czxid) != w.Term.Token() {
		t.Errorf("the remaining node (czxid %v, %v) is not the new term's (%d)", stat.Czxid, err, w.Term.Token())
	}
}

// mkdirs creates path and its missing parents as persistent nodes.
func mkdirs(t testing.TB, conn *zk.Conn, path string) {
	t.Helper()
	p := ""
	for _, seg := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		p += "/" + seg
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
}

// timeoutCutter is a dialer that, once armed, rewrites the session timeout
// in the server's reply to the client's next connect request, as a server
// of the ensemble with a lower maxSessionTimeout would grant it on a
// reconnection. (The real server keeps the old timeout: only what the
// client and its probe read is changed.)
type timeoutCutter struct {
	mu    sync.Mutex
	conns []net.Conn
	ms    atomic.Int32 // the timeout to report, in milliseconds; 0 leaves it alone
}

func (d *timeoutCutter) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return &cuttingConn{Conn: c, ms: d.ms.Load()}, nil
}

// drop breaks the client's connections, so that it reconnects. (The
// probe's srvr connections are closed already.)
func (d *timeoutCutter) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

type cuttingConn struct {
	net.Conn
	ms  int32
	off int // bytes read so far, up to the end of the timeout field
}

// Read rewrites bytes 8 to 11 of the stream: the frame length (4) and
// protocol version (4) come first, then the timeout.
func (c *cuttingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.ms > 0 && c.off < 12 {
		var field [4]byte
		binary.BigEndian.PutUint32(field[:], uint32(c.ms))
		for i := 0; i < n && c.off+i < 12; i++ {
			if at := c.off + i; at >= 8 {
				b[i] = field[at-8]
			}
		}
	}
	c.off += n
	return n, err
}

// TestTimeoutCutOnReconnectEndsTerm: a term promised safe-until by the
// session timeout it had must not outlive a reconnection that granted a
// shorter one, since the server then expires the session by the shorter.
func TestTimeoutCutOnReconnectEndsTerm(t *testing.T) {
	t.Parallel()
	srv := testserver.SharedZooKeeper(t)
	root := uniqueRoot(t)
	cfg := backend.Config{TTL: 4 * time.Second}
	d := &timeoutCutter{}
	probe := zookeeper.NewSessionProbe(d.dial)
	conn, _, err := zk.Connect([]string{srv.Addr()}, cfg.TTL, zk.WithDialer(probe.Dial), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	b := newBackend(t, conn, zookeeper.Options{Config: cfg, Root: root, Probe: probe})
	raw := rawConn(t, srv.Addr())
	term := testkit.CampaignWithin(t, b, "cut", "x", 10*time.Second)
	session := conn.SessionID()

	d.ms.Store(2000)
	d.drop()
	testkit.WaitDone(t, term, 10*time.Second)
	if !errors.Is(term.Err(), baton.ErrExpired) {
		t.Errorf("term ended with %v, want ErrExpired", term.Err())
	}
	if conn.SessionID() != session {
		t.Fatalf("the client changed session; the test wants a reconnection to the same one")
	}
	// The stopped term's node goes, rather than block others until the
	// session ends.
	testkit.Eventually(t, 10*time.Second, "the stopped term's node to go", func() bool {
		return len(children(t, raw, root+"/cut")) == 0
	})
}
