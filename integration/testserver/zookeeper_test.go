package testserver_test

import (
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-zookeeper/zk"
)

// A server restarted on the same dir brings back its znodes and its live
// sessions: a client that reconnects (through a proxy retargeted to the new
// port) resumes its session, and its ephemeral node is still there. Close
// kills the server (SIGKILL), so this is also a crash: with forceSync=no
// the transaction log is written to the kernel, not fsynced, before the
// server answers, which a process crash cannot lose.
func TestZooKeeperRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	z, err := testserver.NewZooKeeper(dir, testserver.ZooKeeperOptions{})
	if errors.Is(err, testserver.ErrJavaMissing) {
		testserver.Unavailable(t, "zookeeper", err)
	}
	if err != nil {
		t.Fatalf("start zookeeper: %v", err)
	}
	t.Cleanup(z.Close)
	p := testserver.StartProxy(t, z.Addr())

	events := make(chan zk.Event, 64)
	conn, _, err := zk.Connect([]string{p.Addr()}, 20*time.Second, zk.WithLogger(quietZK{}),
		zk.WithEventCallback(func(ev zk.Event) {
			select {
			case events <- ev:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if _, err := conn.Create("/persist", []byte("v"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("create /persist: %v", err)
	}
	if _, err := conn.Create("/persist/eph", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("create ephemeral: %v", err)
	}
	session := conn.SessionID()

	z.Close()
	z, err = testserver.NewZooKeeper(dir, testserver.ZooKeeperOptions{})
	if err != nil {
		t.Fatalf("restart zookeeper: %v", err)
	}
	t.Cleanup(z.Close)
	p.Retarget(z.Addr())

	// The client reconnects on its own; the session must come back, not
	// expire. Events from the first connection are still queued: only a
	// session after the disconnection counts.
	deadline := time.After(30 * time.Second)
	for disconnected, reconnected := false, false; !reconnected; {
		select {
		case ev := <-events:
			switch {
			case ev.State == zk.StateExpired:
				t.Fatalf("session expired across the restart")
			case ev.State == zk.StateDisconnected:
				disconnected = true
			case ev.State == zk.StateHasSession && disconnected:
				if conn.SessionID() != session {
					t.Fatalf("client got session %#x after the restart, want %#x", conn.SessionID(), session)
				}
				reconnected = true
			}
		case <-deadline:
			t.Fatalf("client not back in its session 30 s after the restart; state %v", conn.State())
		}
	}
	data, _, err := conn.Get("/persist")
	if err != nil || string(data) != "v" {
		t.Errorf("/persist after restart = %q, %v; want v", data, err)
	}
	_, stat, err := conn.Get("/persist/eph")
	if err != nil || stat.EphemeralOwner != session {
		t.Errorf("ephemeral after restart: %+v, %v; want owned by session %#x", stat, err, session)
	}
}

// quietZK drops the client's reconnect chatter.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}
