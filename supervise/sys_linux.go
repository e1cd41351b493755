package supervise

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// guardExe returns what Start re-executes: this program's file, even if the
// path it was started from has since been replaced or removed.
func guardExe() (string, error) { return "/proc/self/exe", nil }

// socketpair returns a connected pair of Unix stream sockets, both
// close-on-exec.
func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}

// nameGuard sets the guard's process name (comm), which ps shows: it
// shows "exe" for /proc/self/exe otherwise.
func nameGuard() {
	if name, err := unix.BytePtrFromString(guardName); err == nil {
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
	}
}
