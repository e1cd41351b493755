package main

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// Two agents on one port of two loopback addresses (127.0.0.1:P and
// 127.0.0.2:P), as one user, each have a socket and a token file of their
// own: the clients of each lead through it, and when one agent stops it
// removes its own files only, so that new clients of the other still lead.
func TestAgentsOnOnePortKeepTheirOwnFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	// A port free on both addresses: all of 127.0.0.0/8 is loopback on
	// Linux, so only another process on the port can refuse it.
	var port string
	for tries := 0; ; tries++ {
		_, port, _ = net.SplitHostPort(freePort(t))
		ln, err := net.Listen("tcp", "127.0.0.2:"+port)
		if err == nil {
			ln.Close()
			break
		}
		if tries == 10 {
			t.Fatalf("no port free on both 127.0.0.1 and 127.0.0.2: %v", err)
		}
	}
	var agents []*batonProc
	var https []string
	for i, host := range []string{"127.0.0.1", "127.0.0.2"} {
		name := []string{"one", "two"}[i]
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name, "--host", "127.0.0.1"); r.code != 0 {
			t.Fatalf("tls cert: %d %s", r.code, r.stderr)
		}
		httpAddr, bind := net.JoinHostPort(host, port), freePort(t)
		sock := agentSocketOf(t, httpAddr)
		t.Cleanup(func() { _ = os.Remove(sock); _ = os.Remove(agentTokenFileOf(sock)) })
		agents = append(agents, startBaton(t, "agent-"+name, testEnv("BATON_SECRET=agent-test-secret-0123456789"), "agent",
			"--bind", bind, "--join", "static:"+bind, "--bootstrap-expect", "1", "--voters", "1",
			"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"),
			"--http", httpAddr))
		https = append(https, httpAddr)
		testkit.Eventually(t, 30*time.Second, "agent "+httpAddr+" serving", func() bool { return agentServing(httpAddr) })
	}
	socks := []string{agentSocketOf(t, https[0]), agentSocketOf(t, https[1])}
	if socks[0] == socks[1] {
		t.Fatalf("both agents default to the socket %s", socks[0])
	}
	var tokens []string
	for _, s := range socks {
		tok, err := readAgentToken(agentTokenFileOf(s))
		if err != nil {
			t.Fatalf("token file of %s: %v", s, err)
		}
		tokens = append(tokens, tok)
	}
	if tokens[0] == tokens[1] {
		t.Fatal("both agents' token files hold one token")
	}
	leads := func(i int, lease string) func() bool {
		return func() bool {
			return runBaton(t, 30*time.Second, "is-leader", "--backend", "agent://"+https[i], "--lease", lease, "--id", "w").code == 0
		}
	}
	for i, lease := range []string{"files-one", "files-two"} {
		startBaton(t, "run-"+lease, testEnv(), "run", "--backend", "agent://"+https[i], "--lease", lease, "--id", "w", "--ttl", "3s", "--", "sleep", "600")
		testkit.Eventually(t, 60*time.Second, "a client of agent "+https[i]+" leading", leads(i, lease))
	}

	_ = agents[1].cmd.Process.Signal(syscall.SIGTERM)
	if code := agents[1].wait(t, 30*time.Second); code != 0 {
		t.Fatalf("agent two exited %d after SIGTERM", code)
	}
	for _, f := range []string{socks[1], agentTokenFileOf(socks[1])} {
		if _, err := os.Lstat(f); !os.IsNotExist(err) {
			t.Errorf("agent two's %s outlived it: %v", f, err)
		}
	}
	for _, f := range []string{socks[0], agentTokenFileOf(socks[0])} {
		if _, err := os.Lstat(f); err != nil {
			t.Errorf("agent one's %s is gone after agent two stopped: %v", f, err)
		}
	}
	startBaton(t, "run-after", testEnv(), "run", "--backend", "agent://"+https[0], "--lease", "files-after", "--id", "w", "--ttl", "3s", "--", "sleep", "600")
	testkit.Eventually(t, 60*time.Second, "a new client of agent one leading after agent two stopped", leads(0, "files-after"))
}
