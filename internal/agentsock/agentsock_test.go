//go:build linux

package agentsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// listenEnv makes the test binary a server of another user: it listens on
// the socket path it names, prints "ready", and serves until killed.
const listenEnv = "AGENTSOCK_TEST_LISTEN"

func TestMain(m *testing.M) {
	if path := os.Getenv(listenEnv); path != "" {
		ln, err := net.Listen("unix", path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("ready")
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			_, _ = c.Write([]byte("credentials, please\n"))
		}
	}
	os.Exit(m.Run())
}

func serve(t *testing.T, path string) *Listener {
	t.Helper()
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln
}

// A socket of this user in a directory only this user can write is
// proved; Close removes it.
func TestDialProvesOwnAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent", "a.sock")
	ln := serve(t, sock)
	c, err := Dial(t.Context(), sock)
	if err != nil {
		t.Fatalf("Dial of this user's own socket: %v", err)
	}
	c.Close()
	ln.Close()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Close: %v, want removed", err)
	}
}

// A socket in a directory that others may write to proves nothing: Dial
// refuses before it connects, and Listen refuses to make one there.
func TestDialRefusesOpenDirectory(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(open, "a.sock")
	serve(t, sock)
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	var de *DirError
	if _, err := Dial(t.Context(), sock); !errors.As(err, &de) {
		t.Errorf("Dial in a directory anyone may write: %v, want a DirError", err)
	}
	if _, err := Listen(filepath.Join(open, "b.sock")); !errors.As(err, &de) {
		t.Errorf("Listen in a directory anyone may write: %v, want a DirError", err)
	}
}

// A process of another user serving the socket (neither the directory's
// owner nor root) gets no connection: Dial returns a PeerError. Root only:
// it takes another user's process.
func TestDialRefusesAnotherUsersServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a server as another user")
	}
	dir := filepath.Join(t.TempDir(), "agent")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	testkit.ShareWith(t, dir)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	testkit.ShareWith(t, self)
	sock := filepath.Join(dir, "a.sock")
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), listenEnv+"="+sock)
	const impostor = 12345
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: impostor, Gid: impostor}, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("the other user's server: %q %v", buf, err)
	}
	// The directory now belongs to nobody and only nobody may write it:
	// the server, a third user, is not its owner.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, testkit.NobodyUID, testkit.NobodyGID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var pe *PeerError
	if _, err := Dial(ctx, sock); !errors.As(err, &pe) || pe.PeerUID != impostor || pe.OwnerUID != testkit.NobodyUID {
		t.Fatalf("Dial of a socket served by user %d in user %d's directory: %v, want a PeerError", impostor, testkit.NobodyUID, err)
	}
}

// Listen refuses a path where a live server answers, replaces a socket
// nobody serves, and Close leaves alone a file another process put in its
// place.
func TestListenKeepsToItsOwnSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "a.sock")
	ln := serve(t, sock)
	if _, err := Listen(sock); err == nil {
		t.Fatal("a second Listen on a served socket succeeded")
	}
	ln.Close()
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // a crashed agent's socket: the file, nobody serving it
	ln2, err := Listen(sock)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	other := serve(t, sock) // another agent took the path
	ln2.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("Close removed another listener's socket: %v", err)
	}
	other.Close()
}

// A socket file whose server is gone (closed without removing it, as a
// killed agent leaves it) is stale; a served one and a missing one are
// not.
func TestStale(t *testing.T) {
	dir := t.TempDir()
	live, dead := filepath.Join(dir, "live.sock"), filepath.Join(dir, "dead.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: live, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gone, err := net.ListenUnix("unix", &net.UnixAddr{Name: dead, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	gone.SetUnlinkOnClose(false)
	gone.Close()
	if Stale(live) {
		t.Error("a served socket is stale")
	}
	if !Stale(dead) {
		t.Error("a socket nobody serves is not stale")
	}
	if Stale(filepath.Join(dir, "missing.sock")) {
		t.Error("a missing socket is stale")
	}
}
