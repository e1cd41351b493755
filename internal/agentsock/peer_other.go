//go:build !linux && !darwin

package agentsock

import (
	"errors"
	"net"
)

// PeerUID returns the user of the process at the other end of c. Only
// Linux and macOS are supported: elsewhere it returns an error, and Dial
// refuses.
func PeerUID(net.Conn) (uint32, error) {
	return 0, errors.New("agentsock: the agent's socket is checked (SO_PEERCRED) on Linux and macOS only")
}
