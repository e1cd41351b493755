package raft

import (
	"net"
	"strings"
	"testing"
)

// TestAdvertiseAddrRefusesUnspecified: an advertised address is one peers
// dial, so 0.0.0.0 or :: there is refused with the reason, as it is when
// the member is bound to one and advertises nothing.
func TestAdvertiseAddrRefusesUnspecified(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7390}
	for _, bad := range []string{"0.0.0.0:7390", "[::]:7390", "10.0.0.5", ":7390"} {
		if got, err := advertiseAddr(bad, bound); err == nil {
			t.Errorf("advertiseAddr(%q) = %q, want an error", bad, got)
		} else if !strings.Contains(err.Error(), bad) {
			t.Errorf("advertiseAddr(%q): %v, want the error to name it", bad, err)
		}
	}
	if got, err := advertiseAddr("10.0.0.5:7390", bound); err != nil || got != "10.0.0.5:7390" {
		t.Errorf("advertiseAddr(10.0.0.5:7390) = %q, %v", got, err)
	}
	if _, err := advertiseAddr("", &net.TCPAddr{IP: net.IPv4zero, Port: 7390}); err == nil {
		t.Error("bound to 0.0.0.0 with nothing advertised: no error")
	}
}
