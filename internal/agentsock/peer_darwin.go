package agentsock

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// PeerUID returns the user of the process at the other end of c, a Unix
// socket connection, as the kernel recorded it when the connection was
// made (LOCAL_PEERCRED, macOS's SO_PEERCRED).
func PeerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("agentsock: %T is not a Unix socket connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Xucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptXucred(int(fd), unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if gerr != nil {
		return 0, fmt.Errorf("agentsock: the server's credentials (LOCAL_PEERCRED): %w", gerr)
	}
	return cred.Uid, nil
}
