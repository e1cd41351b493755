package testserver_test

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
)

func TestZooKeeperStandalone(t *testing.T) {
	z := testserver.StartZooKeeper(t, testserver.ZooKeeperOptions{})
	if host, _, err := net.SplitHostPort(z.Addr()); err != nil || host != "127.0.0.1" {
		t.Errorf("Addr() = %q, want 127.0.0.1:PORT", z.Addr())
	}
	out, err := z.FourLetter("srvr")
	if err != nil {
		t.Fatalf("srvr: %v", err)
	}
	if !strings.Contains(out, "Mode: standalone") {
		t.Errorf("srvr answered %q, want Mode: standalone", out)
	}
	if out, err := z.FourLetter("ruok"); err != nil || out != "imok" {
		t.Errorf("ruok = %q, %v; want imok", out, err)
	}
	if z.TLSAddr() != "" || z.ClientTLS() != nil {
		t.Errorf("a plain server reports TLS: %q", z.TLSAddr())
	}
	z.Close()
	z.Close() // the cleanup closes again
	if _, err := z.FourLetter("ruok"); err == nil {
		t.Errorf("ruok answered after Close")
	}
}

// The TLS port must complete a handshake with the client configuration, and
// refuse a client without a certificate (ssl.clientAuth=need).
func TestZooKeeperTLS(t *testing.T) {
	z := testserver.StartZooKeeper(t, testserver.ZooKeeperOptions{TLS: true})
	if z.TLSAddr() == "" {
		t.Fatal("no TLS address")
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: z.ClientTLS()}
	c, err := d.Dial("tcp", z.TLSAddr())
	if err != nil {
		t.Fatalf("TLS handshake with the client certificate: %v", err)
	}
	c.Close()

	anon := z.ClientTLS()
	anon.Certificates = nil
	c, err = (&tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: anon}).Dial("tcp", z.TLSAddr())
	if err == nil {
		// TLS 1.3 reports a refused client certificate on the first read.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil {
		t.Errorf("a client without a certificate was served")
	}
}

func TestSharedZooKeeperIsShared(t *testing.T) {
	// No other test of this package shares it, so it may stop here rather
	// than in a TestMain.
	t.Cleanup(testserver.StopSharedZooKeeper)
	a := testserver.SharedZooKeeper(t)
	b := testserver.SharedZooKeeper(t)
	if a != b {
		t.Errorf("SharedZooKeeper started two servers: %s and %s", a.Addr(), b.Addr())
	}
}
