package supervise

import (
	"os"
	"syscall"
)

// guardExe returns what Start re-executes: this program's file, as the
// system reported it when the program started.
func guardExe() (string, error) { return os.Executable() }

// socketpair returns a connected pair of Unix stream sockets, both
// close-on-exec. macOS has no SOCK_CLOEXEC: the fork lock keeps a
// concurrent fork from inheriting them before they are marked.
func socketpair() ([2]int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		return fds, err
	}
	syscall.CloseOnExec(fds[0])
	syscall.CloseOnExec(fds[1])
	return fds, nil
}

// nameGuard does nothing: ps shows the guard's argv[0], baton-guard.
func nameGuard() {}
