package testkit

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
)

// handedOut is every port FreePort has returned in this process. The
// kernel may give a port it just gave out again as soon as its listener
// is closed, so that two servers a test starts side by side would be told
// to bind the same port; FreePort skips those.
var handedOut = struct {
	sync.Mutex
	ports map[string]bool
}{ports: map[string]bool{}}

// FreePort returns a TCP port on ip (a loopback address such as
// "127.0.0.1") that was free a moment ago and that no earlier call in this
// process returned. Another process may still take it before the caller
// binds it: the caller's server should fail clearly when it cannot bind.
func FreePort(ip string) (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			_ = ln.Close()
		}
	}()
	for range 100 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return 0, err
		}
		// Keep a refused port's listener open, so that the kernel gives
		// another one on the next try.
		held = append(held, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		key := net.JoinHostPort(ip, strconv.Itoa(port))
		if !handedOut.ports[key] {
			handedOut.ports[key] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("no port on %s that this process has not handed out already, in 100 tries", ip)
}

// FreeAddr is FreePort as "ip:port", failing the test if no port is found.
func FreeAddr(t testing.TB, ip string) string {
	t.Helper()
	port, err := FreePort(ip)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(ip, strconv.Itoa(port))
}
