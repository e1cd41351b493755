package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// The man in the middle of the raft tests: the test binary, run with
// relayEnv set to LISTEN=TARGET pairs separated by commas. For each pair it
// accepts TCP connections on LISTEN, terminates TLS there with a
// certificate of its own (relayCertEnv and relayKeyEnv: PEM files, say one
// signed by the group's CA; unset: a self-signed one), dials TARGET with
// TLS and the same certificate, and relays the plaintext bytes both ways.
// As each upstream connection opens, and again at its end, it prints one
// JSON line (relayedConn): at the end, how many bytes each side sent and
// how they began. It prints "listening"
// once it holds every LISTEN address.
const (
	relayEnv     = "BATON_TEST_RELAY"
	relayCertEnv = "BATON_TEST_RELAY_CERT"
	relayKeyEnv  = "BATON_TEST_RELAY_KEY"
)

func init() {
	if pairs := os.Getenv(relayEnv); pairs != "" {
		os.Exit(relayMain(pairs))
	}
}

// relayedConn is what the relay saw of one relayed connection.
type relayedConn struct {
	Open        bool   `json:"open,omitempty"` // printed as the upstream connection opens; the rest at its end
	Listen      string `json:"listen"`
	Upstream    string `json:"upstream"`     // the relay's own address towards TARGET
	FromDialer  int    `json:"from_dialer"`  // plaintext bytes the dialing member sent
	FromTarget  int    `json:"from_target"`  // plaintext bytes the target member sent
	DialerHead  string `json:"dialer_head"`  // the first of them, hex
	TargetHead  string `json:"target_head"`  // the first of them, hex
	UpstreamErr string `json:"upstream_err"` // why TLS with TARGET failed, if it did
}

func relayMain(pairs string) int {
	cert, err := relayCertificate()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	server := &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13}
	client := &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	var out sync.Mutex
	report := func(r relayedConn) {
		b, _ := json.Marshal(r)
		out.Lock()
		fmt.Println(string(b))
		out.Unlock()
	}
	var lns []net.Listener
	for pair := range strings.SplitSeq(pairs, ",") {
		listen, target, _ := strings.Cut(pair, "=")
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go relayOne(c, listen, target, server, client, report)
			}
		}()
	}
	fmt.Println("listening")
	select {}
}

// relayOne terminates TLS on down, opens TLS to target, and copies the
// plaintext both ways until either side closes.
func relayOne(down net.Conn, listen, target string, server, client *tls.Config, report func(relayedConn)) {
	defer down.Close()
	r := relayedConn{Listen: listen}
	dtls := tls.Server(down, server)
	_ = dtls.SetDeadline(time.Now().Add(10 * time.Second))
	if err := dtls.Handshake(); err != nil {
		return
	}
	_ = dtls.SetDeadline(time.Time{})
	up, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", target, client)
	if err != nil {
		r.UpstreamErr = err.Error()
		report(r)
		return
	}
	defer up.Close()
	r.Upstream = up.LocalAddr().String()
	report(relayedConn{Open: true, Listen: listen, Upstream: r.Upstream})
	var fromDialer, fromTarget countingWriter
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(io.MultiWriter(up, &fromDialer), dtls); _ = up.CloseWrite(); done <- struct{}{} }()
	go func() {
		_, _ = io.Copy(io.MultiWriter(dtls, &fromTarget), up)
		_ = dtls.CloseWrite()
		done <- struct{}{}
	}()
	<-done
	// One side is done; the other gets a moment to finish its answer.
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	r.FromDialer, r.DialerHead = fromDialer.result()
	r.FromTarget, r.TargetHead = fromTarget.result()
	report(r)
}

// countingWriter counts what goes through it and keeps its first bytes.
type countingWriter struct {
	mu   sync.Mutex
	n    int
	head []byte
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += len(p)
	if len(w.head) < 64 {
		w.head = append(w.head, p[:min(len(p), 64-len(w.head))]...)
	}
	return len(p), nil
}

func (w *countingWriter) result() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, hex.EncodeToString(w.head)
}

// relayCertificate is the relay's certificate: the files named in the
// environment, or a new self-signed one.
func relayCertificate() (tls.Certificate, error) {
	if certFile := os.Getenv(relayCertEnv); certFile != "" {
		return tls.LoadX509KeyPair(certFile, os.Getenv(relayKeyEnv))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// startRelay runs the relay process with pairs (LISTEN=TARGET,...) and env,
// and returns what it has relayed so far.
func startRelay(t *testing.T, pairs []string, env ...string) func() []relayedConn {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(testEnv(relayEnv+"="+strings.Join(pairs, ",")), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r := startReporter[relayedConn](t, "relay", cmd, "listening")
	select {
	case <-r.ready:
	case <-r.done:
		t.Fatalf("the relay exited: %s", r.Stderr())
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not start listening")
	}
	return r.Records
}

// A man in the middle between two members: a relay process with a
// certificate of its own (in CA mode one the group's CA signed for it)
// terminates TLS with each member and relays the bytes between them. Two
// real `baton run` members find each other only through it: m1's peer
// address is the relay's port that leads to m2, and m2's the one that
// leads to m1. Each member's proof is bound to its TLS session with the
// relay, which is not the session the other member checks it on, so every
// proof fails: the relay gets nothing but proofs and refusals (no raft
// RPC, no API call, no acceptor's proof), the members refuse the relay's
// connections and say so with its address, and no group forms.
func TestRaftManInTheMiddleGetsNothing(t *testing.T) {
	t.Parallel()
	for _, caMode := range []bool{false, true} {
		name := "secret-only"
		if caMode {
			name = "CA"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testManInTheMiddle(t, caMode)
		})
	}
}

func testManInTheMiddle(t *testing.T, caMode bool) {
	dir := t.TempDir()
	tlsFlags := func(string) []string { return nil }
	var relayEnvs []string
	if caMode {
		if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
			t.Fatalf("tls ca: %d %s", r.code, r.stderr)
		}
		for _, n := range []string{"m1", "m2", "relay"} {
			if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", n, "--host", "127.0.0.1"); r.code != 0 {
				t.Fatalf("tls cert: %d %s", r.code, r.stderr)
			}
		}
		tlsFlags = func(n string) []string {
			return []string{"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, n+".pem"), "--tls-key", filepath.Join(dir, n+"-key.pem")}
		}
		relayEnvs = []string{relayCertEnv + "=" + filepath.Join(dir, "relay.pem"), relayKeyEnv + "=" + filepath.Join(dir, "relay-key.pem")}
	}
	m1, m2, to1, to2 := freePort(t), freePort(t), freePort(t), freePort(t)
	relayed := startRelay(t, []string{to1 + "=" + m1, to2 + "=" + m2}, relayEnvs...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relayed: %+v", relayed())
		}
	})
	env := testEnv("BATON_SECRET=mitm-test-secret-0123456789abcdef")
	var members []*batonProc
	for i, m := range []struct{ name, bind, peer string }{{"m1", m1, to2}, {"m2", m2, to1}} {
		args := append([]string{"run", "--backend", "raft://", "--lease", "mitm", "--id", m.name, "--log-level", "debug",
			"--bind", m.bind, "--join", "static:" + m.peer, "--bootstrap-expect", "2", "--voters", "3"}, tlsFlags(m.name)...)
		members = append(members, startBaton(t, fmt.Sprintf("member %d", i+1), env, append(args, "--", "sleep", "600")...))
	}

	// Both members dialled through the relay, both ways, several times.
	testkit.Eventually(t, 60*time.Second, "connections relayed to both members, and refused by both", func() bool {
		for _, m := range members {
			if strings.Contains(m.out.String(), "in the group") {
				t.Fatalf("%s formed a group through the relay: the relay got it in; relayed: %+v", m.name, relayed())
			}
		}
		to := map[string]int{}
		for _, c := range relayed() {
			if c.UpstreamErr == "" && !c.Open {
				to[c.Listen]++
			}
		}
		return to[to1] >= 2 && to[to2] >= 2 && refusedRelay(members[0], relayed, to1) && refusedRelay(members[1], relayed, to2)
	})
	for _, c := range relayed() {
		if c.Open {
			continue
		}
		if strings.Contains(c.UpstreamErr, "connection refused") {
			continue // a dial before the target member listened
		}
		if c.UpstreamErr != "" {
			t.Errorf("the relay's TLS with %s failed (%s): the test wants TLS to succeed on both sides, so that only the proof stands in the way", c.Listen, c.UpstreamErr)
			continue
		}
		// proto(1) proof(32) from the dialer, and nothing more: the
		// acceptor answered with a refusal ('N' or 'G', one byte) and
		// never with 'Y' and its own proof.
		if c.FromDialer > 33 {
			t.Errorf("the relay got %d bytes from a dialer (%s...): more than the protocol byte and a proof", c.FromDialer, c.DialerHead)
		}
		if c.FromTarget > 1 || strings.HasPrefix(c.TargetHead, hex.EncodeToString([]byte("Y"))) {
			t.Errorf("the relay got %d bytes from %s (%s...): more than a refusal", c.FromTarget, c.Listen, c.TargetHead)
		}
	}
	for _, m := range members {
		if strings.Contains(m.out.String(), "in the group") {
			t.Errorf("%s formed a group through the relay:\n%s", m.name, m.out)
		}
		select {
		case <-m.done:
			t.Errorf("%s exited: %s", m.name, m.out)
		default:
		}
	}
}

// refusedRelay reports whether member m logged a refusal, for the wrong
// secret, of a connection from the relay's side of a connection it relayed
// from listen.
func refusedRelay(m *batonProc, relayed func() []relayedConn, listen string) bool {
	ups := map[string]bool{}
	for _, c := range relayed() {
		if c.Listen == listen && c.Upstream != "" {
			ups[c.Upstream] = true
		}
	}
	for line := range strings.Lines(m.out.String()) {
		if !strings.Contains(line, "refused a connection") || !strings.Contains(line, "wrong secret") {
			continue
		}
		for up := range ups {
			if strings.Contains(line, "peer="+up) {
				return true
			}
		}
	}
	return false
}
