package agentsock

import (
	"fmt"
	"net"
	"syscall"
)

// PeerUID returns the user of the process at the other end of c, a Unix
// socket connection, as the kernel recorded it (SO_PEERCRED).
func PeerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("agentsock: %T is not a Unix socket connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if gerr != nil {
		return 0, fmt.Errorf("agentsock: the server's credentials (SO_PEERCRED): %w", gerr)
	}
	return cred.Uid, nil
}
