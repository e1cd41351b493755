package certs

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ioTimeout bounds every handshake and read, so a hung peer fails the test
// instead of timing it out.
const ioTimeout = 5 * time.Second

// newTestCA makes a CA and fails the test if it cannot.
func newTestCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name, time.Hour)
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	return ca
}

// memberConfig returns ca.Config(name, hosts, opts...) or fails the test.
func memberConfig(t *testing.T, ca *CA, name string, hosts []string, opts ...Option) *tls.Config {
	t.Helper()
	cfg, err := ca.Config(name, hosts, opts...)
	if err != nil {
		t.Fatalf("Config(%q): %v", name, err)
	}
	return cfg
}

// writeMember issues a certificate for name and writes ca.pem, name.pem and
// name-key.pem into dir, returning the Files for them.
func writeMember(t *testing.T, dir string, ca *CA, name string, hosts []string) Files {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(name, hosts, time.Hour)
	if err != nil {
		t.Fatalf("Issue(%q): %v", name, err)
	}
	f := Files{
		CA:   filepath.Join(dir, name+"-ca.pem"),
		Cert: filepath.Join(dir, name+".pem"),
		Key:  filepath.Join(dir, name+"-key.pem"),
	}
	writeTestFile(t, f.CA, ca.CertPEM())
	if err := WritePair(f.Cert, f.Key, certPEM, keyPEM); err != nil {
		t.Fatalf("WritePair: %v", err)
	}
	return f
}

// serverResult is what the one-connection server saw.
type serverResult struct {
	err      error  // handshake or I/O error, nil on success
	peerName string // client certificate's common name
}

// serveOnce listens on host:0 with cfg and answers one connection: after the
// handshake it reads a line and writes back "pong " plus that line. It
// returns the address and a channel that delivers the result. The server's
// goroutine is waited for at cleanup.
func serveOnce(t *testing.T, host string, cfg *tls.Config) (string, <-chan serverResult) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	results := make(chan serverResult, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		raw, err := ln.Accept()
		if err != nil {
			results <- serverResult{err: err}
			return
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(ioTimeout))
		conn := tls.Server(raw, cfg)
		if err := conn.Handshake(); err != nil {
			results <- serverResult{err: err}
			return
		}
		res := serverResult{peerName: conn.ConnectionState().PeerCertificates[0].Subject.CommonName}
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err == nil {
			_, err = conn.Write([]byte("pong " + line))
		}
		res.err = err
		results <- res
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String(), results
}

// exchange dials addr with cfg through tls.DialWithDialer (which sets
// ServerName from addr), sends a ping and checks the reply. It returns the
// server certificate's common name.
func exchange(addr string, cfg *tls.Config) (string, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: ioTimeout}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return talk(conn)
}

// talk pings over an established client connection. In TLS 1.3 the client
// finishes its handshake before the server has checked the client's
// certificate, so a refusal by the server shows up here, on the read.
func talk(conn *tls.Conn) (string, error) {
	_ = conn.SetDeadline(time.Now().Add(ioTimeout))
	if err := conn.Handshake(); err != nil {
		return "", err
	}
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	if reply != "pong ping\n" {
		return "", errors.New("unexpected reply " + reply)
	}
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestLoadHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "group CA")
	serverCfg, err := Load(writeMember(t, dir, ca, "node-1", []string{"127.0.0.1"}))
	if err != nil {
		t.Fatalf("Load server: %v", err)
	}
	clientCfg, err := Load(writeMember(t, dir, ca, "node-2", []string{"127.0.0.1"}))
	if err != nil {
		t.Fatalf("Load client: %v", err)
	}
	if serverCfg.MinVersion != tls.VersionTLS13 || serverCfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("config: MinVersion %#x ClientAuth %v, want TLS 1.3 and RequireAndVerifyClientCert", serverCfg.MinVersion, serverCfg.ClientAuth)
	}

	addr, results := serveOnce(t, "127.0.0.1", serverCfg)
	peer, err := exchange(addr, clientCfg)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if peer != "node-1" {
		t.Errorf("client saw server %q, want node-1", peer)
	}
	res := <-results
	if res.err != nil {
		t.Fatalf("server: %v", res.err)
	}
	if res.peerName != "node-2" {
		t.Errorf("server saw client %q, want node-2", res.peerName)
	}
}

// TestConfigWithoutServerName dials the way a raft stream layer may:
// tls.Client over its own net.Conn, with no ServerName. The default mode
// needs none.
func TestConfigWithoutServerName(t *testing.T) {
	ca := newTestCA(t, "group CA")
	addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", nil))
	raw, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	conn := tls.Client(raw, memberConfig(t, ca, "node-2", nil))
	defer conn.Close()
	if _, err := talk(conn); err != nil {
		t.Fatalf("client: %v", err)
	}
	if res := <-results; res.err != nil {
		t.Fatalf("server: %v", res.err)
	}
}

func TestClientWithoutCertificateRefused(t *testing.T) {
	ca := newTestCA(t, "group CA")
	addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"127.0.0.1"}))
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	// Trusts the server, presents nothing.
	client := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	if _, err := exchange(addr, client); err == nil {
		t.Fatal("client without a certificate got a reply")
	}
	res := <-results
	if res.err == nil || !strings.Contains(res.err.Error(), "certificate") {
		t.Fatalf("server: got %v, want a refusal for the missing client certificate", res.err)
	}
}

func TestClientFromOtherCARefused(t *testing.T) {
	ca := newTestCA(t, "group CA")
	other := newTestCA(t, "other CA")
	addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"127.0.0.1"}))

	// The client trusts the group CA, so the server passes its check, but
	// its own certificate is from another CA.
	certPEM, keyPEM, err := other.Issue("intruder", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	client := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
	if _, err := exchange(addr, client); err == nil {
		t.Fatal("client from another CA got a reply")
	}
	res := <-results
	var unknown x509.UnknownAuthorityError
	if !errors.As(res.err, &unknown) {
		t.Fatalf("server: got %v, want x509.UnknownAuthorityError", res.err)
	}

	// And a member config from the other CA, as a misconfigured peer would
	// use, is refused too (by whichever side checks first).
	addr, results = serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"127.0.0.1"}))
	if _, err := exchange(addr, memberConfig(t, other, "intruder", []string{"127.0.0.1"})); err == nil {
		t.Fatal("member of another group got a reply")
	}
	if res := <-results; res.err == nil {
		t.Fatal("server accepted a member of another group")
	}
}

func TestServerFromOtherCARefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"VerifyPeerName", []Option{VerifyPeerName(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := newTestCA(t, "group CA")
			other := newTestCA(t, "other CA")
			addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, other, "impostor", []string{"127.0.0.1"}))
			_, err := exchange(addr, memberConfig(t, ca, "node-2", []string{"127.0.0.1"}, tc.opts...))
			var verr *tls.CertificateVerificationError
			var unknown x509.UnknownAuthorityError
			if !errors.As(err, &verr) || !errors.As(err, &unknown) {
				t.Fatalf("client: got %v, want a tls.CertificateVerificationError for an unknown authority", err)
			}
			if res := <-results; res.err == nil {
				t.Fatal("server completed a connection the client refused")
			}
		})
	}
}

// TestPeerUsageEnforced checks the extended key usage at handshake time:
// a server must allow TLS server auth, a client TLS client auth.
func TestPeerUsageEnforced(t *testing.T) {
	ca := newTestCA(t, "group CA")
	serverOnly := craftedConfig(t, ca, "server-only", func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	clientOnly := craftedConfig(t, ca, "client-only", func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})

	t.Run("server without ServerAuth", func(t *testing.T) {
		addr, results := serveOnce(t, "127.0.0.1", clientOnly)
		_, err := exchange(addr, memberConfig(t, ca, "node-2", nil))
		var invalid x509.CertificateInvalidError
		if !errors.As(err, &invalid) || invalid.Reason != x509.IncompatibleUsage {
			t.Fatalf("client: got %v, want an incompatible-usage error", err)
		}
		<-results
	})
	t.Run("client without ClientAuth", func(t *testing.T) {
		addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", nil))
		if _, err := exchange(addr, serverOnly); err == nil {
			t.Fatal("client without ClientAuth got a reply")
		}
		res := <-results
		var invalid x509.CertificateInvalidError
		if !errors.As(res.err, &invalid) || invalid.Reason != x509.IncompatibleUsage {
			t.Fatalf("server: got %v, want an incompatible-usage error", res.err)
		}
	})
}

// craftedConfig builds a member config around a certificate that Issue
// would not make, changed by mutate, bypassing Load's checks.
func craftedConfig(t *testing.T, ca *CA, name string, mutate func(*x509.Certificate)) *tls.Config {
	t.Helper()
	leaf, key := craftLeaf(t, ca, name, mutate)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	return newConfig(pool, []*x509.Certificate{leaf}, key, nil)
}

// craftLeaf signs, with ca, a valid member certificate for 127.0.0.1 after
// mutate has changed its template.
func craftLeaf(t *testing.T, ca *CA, name string, mutate func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		NotBefore:   now.Add(-time.Minute),
		NotAfter:    now.Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	if mutate != nil {
		mutate(tmpl)
	}
	leaf, err := ca.sign(tmpl, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return leaf, key
}

func TestVerifyPeerName(t *testing.T) {
	ca := newTestCA(t, "group CA")
	strict := memberConfig(t, ca, "node-2", nil, VerifyPeerName(true))
	lenient := memberConfig(t, ca, "node-2", nil)

	t.Run("name matches", func(t *testing.T) {
		addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"127.0.0.1"}))
		if _, err := exchange(addr, strict); err != nil {
			t.Fatalf("client: %v", err)
		}
		if res := <-results; res.err != nil {
			t.Fatalf("server: %v", res.err)
		}
	})
	t.Run("name differs", func(t *testing.T) {
		addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"10.0.3.7", "node-1.example"}))
		_, err := exchange(addr, strict)
		var hostErr x509.HostnameError
		if !errors.As(err, &hostErr) {
			t.Fatalf("client: got %v, want x509.HostnameError", err)
		}
		<-results
	})
	t.Run("name differs, default mode", func(t *testing.T) {
		addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"10.0.3.7"}))
		if _, err := exchange(addr, lenient); err != nil {
			t.Fatalf("client: %v", err)
		}
		if res := <-results; res.err != nil {
			t.Fatalf("server: %v", res.err)
		}
	})
	t.Run("no ServerName fails closed", func(t *testing.T) {
		addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"127.0.0.1"}))
		raw, err := net.DialTimeout("tcp", addr, ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		conn := tls.Client(raw, strict)
		defer conn.Close()
		if _, err := talk(conn); err == nil || !strings.Contains(err.Error(), "ServerName") {
			t.Fatalf("client: got %v, want crypto/tls's ServerName error", err)
		}
		raw.Close()
		<-results
	})
	t.Run("ForPeer fills ServerName in", func(t *testing.T) {
		addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", []string{"127.0.0.1"}))
		raw, err := net.DialTimeout("tcp", addr, ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		conn := tls.Client(raw, ForPeer(strict, addr))
		defer conn.Close()
		if _, err := talk(conn); err != nil {
			t.Fatalf("client: %v", err)
		}
		if res := <-results; res.err != nil {
			t.Fatalf("server: %v", res.err)
		}
		if strict.ServerName != "" {
			t.Error("ForPeer changed the config it was given")
		}
		if got := ForPeer(strict, "[::1]:7946").ServerName; got != "::1" {
			t.Errorf("ForPeer([::1]:7946).ServerName = %q, want ::1", got)
		}
		if got := ForPeer(strict, "10.0.3.7").ServerName; got != "10.0.3.7" {
			t.Errorf("ForPeer(10.0.3.7).ServerName = %q, want 10.0.3.7", got)
		}
	})
}

// TestOtherAddresses dials addresses other than 127.0.0.1, standing in for a
// network namespace's or another host's IP: ::1 and 127.0.0.2.
func TestOtherAddresses(t *testing.T) {
	ca := newTestCA(t, "group CA")
	for _, host := range []string{"::1", "127.0.0.2"} {
		t.Run(host, func(t *testing.T) {
			if ln, err := net.Listen("tcp", net.JoinHostPort(host, "0")); err != nil {
				t.Skipf("cannot listen on %s: %v", host, err)
			} else {
				ln.Close()
			}
			addr, results := serveOnce(t, host, memberConfig(t, ca, "node-1", []string{host}))
			if _, err := exchange(addr, memberConfig(t, ca, "node-2", nil, VerifyPeerName(true))); err != nil {
				t.Fatalf("client: %v", err)
			}
			if res := <-results; res.err != nil {
				t.Fatalf("server: %v", res.err)
			}
		})
	}
}

func TestIssue(t *testing.T) {
	ca := newTestCA(t, "group CA")
	certPEM, keyPEM, err := ca.Issue("node-1", []string{"10.0.3.7", "[::1]", "node-1.example"}, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("Issue output is not a key pair: %v", err)
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "node-1" {
		t.Errorf("CN %q, want node-1", cert.Subject.CommonName)
	}
	if len(cert.IPAddresses) != 2 || !cert.IPAddresses[0].Equal(net.ParseIP("10.0.3.7")) || !cert.IPAddresses[1].Equal(net.IPv6loopback) {
		t.Errorf("IPAddresses %v, want [10.0.3.7 ::1]", cert.IPAddresses)
	}
	if len(cert.DNSNames) != 1 || cert.DNSNames[0] != "node-1.example" {
		t.Errorf("DNSNames %v, want [node-1.example]", cert.DNSNames)
	}
	if missingUsages(cert) != "" || len(cert.ExtKeyUsage) != 2 {
		t.Errorf("ExtKeyUsage %v, want ServerAuth and ClientAuth", cert.ExtKeyUsage)
	}
	if cert.NotAfter.After(ca.Certificate().NotAfter) {
		t.Errorf("certificate outlives its CA: %s > %s", cert.NotAfter, ca.Certificate().NotAfter)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", cert.PublicKey)
	}

	for _, bad := range []string{"10.0.3.7:7946", "", "https://node-1", "fe80::1%eth0"} {
		if _, _, err := ca.Issue("node-1", []string{bad}, 0); err == nil {
			t.Errorf("Issue with host %q: no error", bad)
		}
	}
	if _, _, err := ca.Issue("", nil, 0); err == nil {
		t.Error("Issue without a name: no error")
	}
	if _, _, err := ca.Issue("node-1", nil, -time.Hour); err == nil {
		t.Error("Issue with negative validity: no error")
	}
}

func TestCAFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "group CA")
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if err := ca.WriteFiles(certFile, keyFile); err != nil {
		t.Fatalf("WriteFiles: %v", err)
	}
	assertMode(t, keyFile, 0o600)

	loaded, err := LoadCA(certFile, keyFile)
	if err != nil {
		t.Fatalf("LoadCA: %v", err)
	}
	if !loaded.Certificate().Equal(ca.Certificate()) {
		t.Fatal("LoadCA returned a different certificate")
	}
	// A member issued by the loaded CA talks to one issued by the original.
	addr, results := serveOnce(t, "127.0.0.1", memberConfig(t, ca, "node-1", nil))
	if _, err := exchange(addr, memberConfig(t, loaded, "node-2", nil)); err != nil {
		t.Fatalf("client issued by loaded CA: %v", err)
	}
	if res := <-results; res.err != nil {
		t.Fatalf("server: %v", res.err)
	}

	if err := ca.WriteFiles(certFile, filepath.Join(dir, "other-key.pem")); err == nil {
		t.Error("WriteFiles overwrote an existing certificate file")
	}
	if err := ca.WriteFiles(filepath.Join(dir, "new.pem"), keyFile); !errors.Is(err, fs.ErrExist) {
		t.Errorf("WriteFiles over an existing key file: got %v, want fs.ErrExist", err)
	}
	if _, err := LoadCA(filepath.Join(dir, "new.pem"), keyFile); !errors.Is(err, ErrMissing) {
		t.Errorf("WriteFiles left a certificate behind after failing: LoadCA got %v", err)
	}
	if _, err := LoadCA(filepath.Join(dir, "other-key.pem"), keyFile); !errors.Is(err, ErrMissing) {
		t.Errorf("WriteFiles left a key behind after failing: %v", err)
	}

	// LoadCA's own checks.
	other := newTestCA(t, "other CA")
	otherDir := t.TempDir()
	if err := other.WriteFiles(filepath.Join(otherDir, "ca.pem"), filepath.Join(otherDir, "ca-key.pem")); err != nil {
		t.Fatal(err)
	}
	_, err = LoadCA(certFile, filepath.Join(otherDir, "ca-key.pem"))
	assertFileError(t, err, FieldCAKey, ErrKeyMismatch, "does not match")
	_, err = LoadCA(certFile, "")
	assertFileError(t, err, FieldCAKey, ErrMissing, "not set")
	member := writeMember(t, dir, ca, "node-1", nil)
	_, err = LoadCA(member.Cert, member.Key)
	assertFileError(t, err, FieldCA, ErrNotCA, "not a CA certificate")
}

// TestWriteCert: the CA file that ships with members holds the certificate
// and no key; writing it again for the same CA is a no-op, and another CA's
// file in the way is refused and left alone.
func TestWriteCert(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "group CA")
	file := filepath.Join(dir, "ca.pem")
	if err := ca.WriteCert(file); err != nil {
		t.Fatalf("WriteCert: %v", err)
	}
	assertMode(t, file, 0o644)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, ca.CertPEM()) || bytes.Contains(b, []byte("PRIVATE KEY")) {
		t.Fatalf("WriteCert wrote %q, want the certificate alone", b)
	}
	if err := ca.WriteCert(file); err != nil {
		t.Fatalf("WriteCert again for the same CA: %v", err)
	}
	other := newTestCA(t, "other CA")
	if err := other.WriteCert(file); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("WriteCert over another CA's file: %v, want fs.ErrExist", err)
	}
	if b2, _ := os.ReadFile(file); !bytes.Equal(b2, b) {
		t.Fatal("WriteCert replaced another CA's file")
	}
}

func TestNewCA(t *testing.T) {
	ca, err := NewCA("group CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	c := ca.Certificate()
	if !c.IsCA || c.Subject.CommonName != "group CA" {
		t.Errorf("CA certificate: IsCA %v CN %q", c.IsCA, c.Subject.CommonName)
	}
	if got := c.NotAfter.Sub(time.Now()); got < DefaultCAValidity-time.Hour || got > DefaultCAValidity {
		t.Errorf("default validity: %s left, want about %s", got, DefaultCAValidity)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", c.PublicKey)
	}
	if _, err := NewCA("", 0); err == nil {
		t.Error("NewCA without a name: no error")
	}
	if _, err := NewCA("x", -time.Second); err == nil {
		t.Error("NewCA with negative validity: no error")
	}
}
