// Package agentsock is the Unix socket on which `baton agent` takes the
// calls that carry credentials (its bearer token, its clients' session
// secrets), and the checks by which a client proves, before it sends any,
// that the process serving the socket is the agent.
//
// What a client that connects with Dial is guaranteed:
//
//   - The socket's directory can be written only by its owner (and root):
//     it is not writable by group or others, and every directory above it
//     is owned by root or that owner and is not writable by others unless
//     sticky (as /tmp is). So no other user can have put a socket, or a
//     link to one, at the path, or can swap the directory.
//   - The process serving the socket runs as that owner, or as root: the
//     kernel's record of the listener's credentials (SO_PEERCRED), which a
//     process cannot forge, says so. A process of another user never
//     learns the credentials, even if the agent crashed and that user
//     holds the agent's TCP port.
//
// Not guaranteed: that the serving process is `baton agent` rather than
// another program of the same user (or root), who can read the agent's
// token file anyway. Linux and macOS (LOCAL_PEERCRED) only: elsewhere Dial
// refuses.
//
// Listen is the agent's side: it refuses a directory the checks above
// would refuse, refuses a path where another live server answers, and its
// Close removes the socket file only while it is still the one it made.
package agentsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// PeerError is Dial's error when the process serving the socket runs as
// another user than the socket directory's owner (and is not root).
type PeerError struct {
	Path     string
	PeerUID  uint32 // the serving process's user
	OwnerUID uint32 // the owner of the socket's directory
}

// Error says who serves the socket and whom the client expected.
func (e *PeerError) Error() string {
	return fmt.Sprintf("agentsock: %s is served by a process of user %d, not of user %d who owns its directory (nor root): it is not the agent; no credential was sent",
		e.Path, e.PeerUID, e.OwnerUID)
}

// DirError is the error of a socket directory that other users could write
// to (or swap), where a socket proves nothing.
type DirError struct {
	Dir    string
	Reason string
}

// Error names the directory and what is wrong with it.
func (e *DirError) Error() string {
	return fmt.Sprintf("agentsock: socket directory %s: %s: use a directory only the agent's user can write to (and whose parents others cannot rename)", e.Dir, e.Reason)
}

// CheckDir checks that dir (symbolic links resolved) can be written only by
// its owner or root, and that no directory above it can be written by
// others; it returns the resolved directory and its owner.
func CheckDir(dir string) (resolved string, owner uint32, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", 0, err
	}
	resolved, err = filepath.EvalSymlinks(abs)
	if err != nil {
		return "", 0, fmt.Errorf("agentsock: socket directory: %w", err)
	}
	st, err := os.Stat(resolved)
	if err != nil {
		return "", 0, fmt.Errorf("agentsock: socket directory: %w", err)
	}
	if !st.IsDir() {
		return "", 0, &DirError{Dir: resolved, Reason: "not a directory"}
	}
	owner = uidOf(st)
	if st.Mode().Perm()&0o022 != 0 {
		return "", 0, &DirError{Dir: resolved, Reason: fmt.Sprintf("writable by other users (mode %s)", st.Mode().Perm())}
	}
	for p := filepath.Dir(resolved); ; p = filepath.Dir(p) {
		pst, err := os.Stat(p)
		if err != nil {
			return "", 0, fmt.Errorf("agentsock: socket directory: %w", err)
		}
		if u := uidOf(pst); u != 0 && u != owner {
			return "", 0, &DirError{Dir: resolved, Reason: fmt.Sprintf("its parent %s belongs to user %d, who could swap it", p, u)}
		}
		if pst.Mode().Perm()&0o022 != 0 && pst.Mode()&fs.ModeSticky == 0 {
			return "", 0, &DirError{Dir: resolved, Reason: fmt.Sprintf("its parent %s is writable by other users (mode %s), who could swap it", p, pst.Mode().Perm())}
		}
		if p == filepath.Dir(p) {
			return resolved, owner, nil
		}
	}
}

func uidOf(st fs.FileInfo) uint32 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Uid
	}
	return ^uint32(0)
}

// Dial connects to the agent's socket at path, within ctx, and returns the
// connection only once it has proved the server (see the package doc):
// otherwise a *DirError, a *PeerError, or the error of the connect.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	dir, owner, err := CheckDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	full := filepath.Join(dir, filepath.Base(path))
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", full)
	if err != nil {
		return nil, err
	}
	uid, err := PeerUID(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	if uid != owner && uid != 0 {
		c.Close()
		return nil, &PeerError{Path: full, PeerUID: uid, OwnerUID: owner}
	}
	return c, nil
}

// Listener is the agent's socket. Close stops it and removes the socket
// file, unless another process has replaced the file meanwhile.
type Listener struct {
	*net.UnixListener
	path string
	made fs.FileInfo // the socket file as Listen made it

	once sync.Once
}

// Stale reports whether path is a socket that nobody serves: the file of
// an agent that was killed before it could remove it, which refuses every
// connection. A socket that accepts, or that cannot be tried (no such
// file, no permission), is not stale.
func Stale(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// Listen makes the agent's socket at path, mode 0666 (who may connect is
// the agent's token's business; a client's proof of the server is the
// directory and SO_PEERCRED): it creates the directory (mode 0755) if
// missing, refuses one that CheckDir refuses or that belongs to another
// user, refuses a path where a live server answers (another agent), and
// replaces a socket file that nobody serves (left by an agent that
// crashed).
func Listen(path string) (*Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("agentsock: socket directory: %w", err)
	}
	dir, owner, err := CheckDir(dir)
	if err != nil {
		return nil, err
	}
	if me := uint32(os.Geteuid()); owner != me {
		return nil, &DirError{Dir: dir, Reason: fmt.Sprintf("it belongs to user %d, not to this agent's user %d, so its clients would refuse the agent", owner, me)}
	}
	path = filepath.Join(dir, filepath.Base(path))
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("agentsock: %s exists and is not a socket: remove it, or choose another path", path)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, derr := (&net.Dialer{}).DialContext(ctx, "unix", path)
		cancel()
		if derr == nil {
			c.Close()
			return nil, fmt.Errorf("agentsock: another process (another agent?) serves %s: give this agent a socket of its own (--socket)", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("agentsock: removing the stale socket %s: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agentsock: %w", err)
	}
	// Removed by Close, only if still ours: another agent may have taken
	// the path after this one stopped serving it.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("agentsock: %w", err)
	}
	made, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("agentsock: %w", err)
	}
	return &Listener{UnixListener: ln, path: path, made: made}, nil
}

// Path returns the socket's path, its directory's links resolved.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket file if it is still the one
// Listen made.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if st, serr := os.Lstat(l.path); serr == nil && os.SameFile(st, l.made) {
			_ = os.Remove(l.path)
		}
	})
	return err
}
