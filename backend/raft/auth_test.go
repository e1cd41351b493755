package raft

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testkit"
)

// These tests run the proof exchange between members (auth.go) over real
// TLS connections on loopback, one side as the mux, the other as
// dialProto or a hand-made peer.

const (
	testSecret  = "0123456789abcdef-test-secret"
	otherSecret = "fedcba9876543210-not-the-secret"
)

// authMode is how the two ends of a test authenticate in TLS: with
// certificates of ca, or, when ca is nil, each with a self-signed
// certificate of its own (the secret-only mode, NodeOptions.TLS nil).
// Every attack on the proof must fail the same way in both.
type authMode struct {
	name string
	ca   *certs.CA
}

func authModes(t *testing.T) []authMode {
	return []authMode{{"CA", testCA(t)}, {"secret-only", nil}}
}

// tlsConfig is the TLS configuration of a member named name.
func (m authMode) tlsConfig(name string) (*tls.Config, error) {
	if m.ca == nil {
		return selfSignedTLS(name)
	}
	return m.ca.Config(name, []string{"127.0.0.1"})
}

func (m authMode) config(t *testing.T, name string) *tls.Config {
	t.Helper()
	cfg, err := m.tlsConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testMux serves a mux on loopback with key testSecret, refusals logged
// to rec, and hands accepted connections to the caller through its
// listeners.
func testMux(t *testing.T, mode authMode, timeout time.Duration, inGroup bool) (*mux, *attrRecorder) {
	t.Helper()
	cfg := mode.config(t, "acceptor")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &attrRecorder{}
	m := &mux{
		ln: ln, creds: newCreds(cfg, testSecret), inGroup: func() bool { return inGroup },
		refusals: newRefusalLog(slog.New(rec), time.Minute), timeout: timeout,
		raft: newChanListener(ln.Addr()), api: newChanListener(ln.Addr()),
	}
	m.start()
	t.Cleanup(func() { _ = m.close() })
	return m, rec
}

func testCA(t *testing.T) *certs.CA {
	t.Helper()
	ca, err := certs.NewCA("auth test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func clientConfig(t *testing.T, ca *certs.CA) *tls.Config {
	t.Helper()
	cfg, err := ca.Config("dialer", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// acceptOne returns the next connection l hands over, or fails after d.
func acceptOne(t *testing.T, l *chanListener, d time.Duration) net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			ch <- c
		}
	}()
	select {
	case c := <-ch:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(d):
		t.Fatalf("no connection handed over within %s", d)
		return nil
	}
}

// waitWarn waits for rec to hold a warning with the given reason whose peer
// is addr, and returns it.
func waitWarn(t *testing.T, rec *attrRecorder, addr, reason string) recorded {
	t.Helper()
	var got recorded
	testkit.Eventually(t, 10*time.Second, "a warning about "+addr+" for "+reason, func() bool {
		for _, r := range rec.find(slog.LevelWarn, "peer", []string{addr}) {
			if r.attrs["reason"] == reason {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

func TestProofBothWays(t *testing.T) {
	for _, mode := range authModes(t) {
		t.Run(mode.name, func(t *testing.T) {
			m, rec := testMux(t, mode, 5*time.Second, false)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, proto := range []byte{protoRaft, protoAPI} {
				c, err := dialProto(ctx, newCreds(mode.config(t, "dialer"), testSecret), nil, m.ln.Addr().String(), proto)
				if err != nil {
					t.Fatalf("dial %c with the group's secret: %v", proto, err)
				}
				l := map[byte]*chanListener{protoRaft: m.raft, protoAPI: m.api}[proto]
				s := acceptOne(t, l, 5*time.Second)
				// The connection carries data both ways after the proofs.
				if _, err := c.Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 4)
				if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "ping" {
					t.Fatalf("read %q, %v", buf, err)
				}
				c.Close()
			}
			if all := rec.all(); len(all) != 0 {
				t.Fatalf("the mux logged %+v for connections that proved the secret", all)
			}
		})
	}
}

// TestProofWrongSecret: a dialer with another secret is refused, learns
// that it was refused for its secret (and whether by a member of a live
// group), is never handed to raft or the API, and the acceptor logs it.
func TestProofWrongSecret(t *testing.T) {
	for _, mode := range authModes(t) {
		t.Run(mode.name, func(t *testing.T) {
			for _, inGroup := range []bool{false, true} {
				m, rec := testMux(t, mode, 5*time.Second, inGroup)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				raw, err := net.Dial("tcp", m.ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				local := raw.LocalAddr().String()
				c := tls.Client(raw, mode.config(t, "dialer"))
				if err := c.HandshakeContext(ctx); err != nil {
					t.Fatal(err)
				}
				err = newConnKey(otherSecret).dial(c, protoRaft)
				cancel()
				c.Close()
				var re *refusedError
				if !errors.As(err, &re) || !errors.Is(err, ErrSecretRefused) || re.inGroup != inGroup {
					t.Fatalf("in group %v: dial with a wrong secret: %v, want a refusal (in group %v) that is ErrSecretRefused", inGroup, err, inGroup)
				}
				waitWarn(t, rec, local, "wrong secret")
				select {
				case c := <-m.raft.ch:
					t.Fatalf("the mux handed the refused connection to raft: %v", c.RemoteAddr())
				default:
				}
			}
		})
	}
}

// TestProofIsBoundToTheConnection replays, on a second connection, the
// proofs that each side sent on a first one: neither is accepted.
func TestProofIsBoundToTheConnection(t *testing.T) {
	for _, mode := range authModes(t) {
		t.Run(mode.name, func(t *testing.T) {
			key := newConnKey(testSecret)
			m, rec := testMux(t, mode, 5*time.Second, true)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			dialTLS := func(addr string) *tls.Conn {
				t.Helper()
				raw, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				c := tls.Client(raw, mode.config(t, "dialer"))
				if err := c.HandshakeContext(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}

			// The dialer's proof of a first connection, which went through.
			first := dialTLS(m.ln.Addr().String())
			proof, err := key.proof(first.ConnectionState(), roleDialer, protoRaft)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := first.Write(append([]byte{protoRaft}, proof...)); err != nil {
				t.Fatal(err)
			}
			acceptOne(t, m.raft, 5*time.Second)

			// Replayed on a second connection by a peer without the secret.
			second := dialTLS(m.ln.Addr().String())
			if _, err := second.Write(append([]byte{protoRaft}, proof...)); err != nil {
				t.Fatal(err)
			}
			var status [1]byte
			if _, err := io.ReadFull(second, status[:]); err != nil || status[0] != authRefusedInGroup {
				t.Fatalf("answer to a replayed proof: %q, %v; want %q", status, err, authRefusedInGroup)
			}
			waitWarn(t, rec, second.LocalAddr().String(), "wrong secret")

			// The acceptor's side: a fake member without the secret replays a
			// real acceptor's proof of another connection to a dialer.
			cfg, err := mode.tlsConfig("fake")
			if err != nil {
				t.Fatal(err)
			}
			fake, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer fake.Close()
			go func() {
				c, err := fake.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				msg := make([]byte, 1+proofLen)
				if _, err := io.ReadFull(c, msg); err != nil {
					return
				}
				// The acceptor's proof from the first connection.
				theirs, _ := key.proof(first.ConnectionState(), roleAcceptor, protoRaft)
				_, _ = c.Write(append([]byte{authOK}, theirs...))
				_, _ = io.Copy(io.Discard, c)
			}()
			_, err = dialProto(ctx, newCreds(mode.config(t, "dialer"), testSecret), nil, fake.Addr().String(), protoRaft)
			if !errors.Is(err, errBadProof) {
				t.Fatalf("dial to a peer that replays another connection's proof: %v, want errBadProof", err)
			}
		})
	}
}

// TestProofStalledPeer: a peer that finishes TLS and then sends nothing is
// dropped by the acceptor when its deadline passes, and logged; a dialer
// facing an acceptor that never answers gives up at its context's end.
func TestProofStalledPeer(t *testing.T) {
	for _, mode := range authModes(t) {
		t.Run(mode.name, func(t *testing.T) {
			m, rec := testMux(t, mode, 300*time.Millisecond, false)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			raw, err := net.Dial("tcp", m.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			c := tls.Client(raw, mode.config(t, "dialer"))
			if err := c.HandshakeContext(ctx); err != nil {
				t.Fatal(err)
			}
			// The mux closes the connection: the read ends with an error, not
			// with the test's deadline.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
				t.Fatalf("read from a stalled connection: %v, want it closed by the acceptor", err)
			}
			waitWarn(t, rec, raw.LocalAddr().String(), "timeout")

			// A stalled acceptor: TLS, then silence.
			cfg, err := mode.tlsConfig("mute")
			if err != nil {
				t.Fatal(err)
			}
			mute, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer mute.Close()
			go func() {
				c, err := mute.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
			dctx, dcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer dcancel()
			_, err = dialProto(dctx, newCreds(mode.config(t, "dialer"), testSecret), nil, mute.Addr().String(), protoAPI)
			if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
				t.Fatalf("dial to a mute acceptor: %v, want a deadline error", err)
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestProofRefusesOthers: a plain TCP peer that is no TLS client, and a
// TLS client with a certificate of another CA (CA mode) or with none
// (secret-only mode), are refused and logged with the reason: in CA mode,
// which side's certificate failed.
func TestProofRefusesOthers(t *testing.T) {
	for _, mode := range authModes(t) {
		t.Run(mode.name, func(t *testing.T) {
			m, rec := testMux(t, mode, 5*time.Second, false)

			plain, err := net.Dial("tcp", m.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			if _, err := plain.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			waitWarn(t, rec, plain.LocalAddr().String(), "tls")

			// A fresh mux: the first would hold back a second warning about the
			// same host and reason for a minute.
			m, rec = testMux(t, mode, 5*time.Second, false)
			// CA mode: a certificate of another CA. Secret-only mode, where no
			// chain is checked: no certificate at all.
			stranger := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
			if mode.ca != nil {
				stranger = clientConfig(t, testCA(t))
			}
			raw, err := net.Dial("tcp", m.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			c := tls.Client(raw, stranger)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_ = c.Handshake()
			_, _ = c.Read(make([]byte, 1))
			want := "tls"
			if mode.ca != nil {
				// That client refuses the member's certificate (a TLS
				// alert) before it shows its own.
				want = "the peer refused this member's certificate"
			}
			waitWarn(t, rec, raw.LocalAddr().String(), want)
		})
	}

	// CA mode: one that trusts the group's CA but presents a certificate
	// of another: the member names it.
	ca := testCA(t)
	m, rec := testMux(t, authMode{name: "CA", ca: ca}, 5*time.Second, false)
	cfg := clientConfig(t, testCA(t))
	group := clientConfig(t, ca)
	cfg.RootCAs, cfg.VerifyConnection = group.RootCAs, group.VerifyConnection
	raw, err := net.Dial("tcp", m.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := tls.Client(raw, cfg)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_ = c.Handshake()
	_, _ = c.Read(make([]byte, 1))
	waitWarn(t, rec, raw.LocalAddr().String(), "certificate not signed by the group's CA")
}

// TestRefusalLogIsRateLimited: a peer refused in a loop gets one warning
// per window, message and reason; the next one says how many it stands
// for.
func TestRefusalLogIsRateLimited(t *testing.T) {
	rec := &attrRecorder{}
	r := newRefusalLog(slog.New(rec), 200*time.Millisecond)
	for range 100 {
		r.warn("refused a connection", "10.0.0.1:4000", errWrongSecret)
	}
	r.warn("refused a connection", "10.0.0.1:4001", tlsHandshakeError{errors.New("bad certificate")})
	r.warn("refused a connection", "10.0.0.2:4000", errWrongSecret)
	if got := len(rec.all()); got != 3 {
		t.Fatalf("%d warnings, want 3 (one per host and reason): %+v", got, rec.all())
	}
	time.Sleep(250 * time.Millisecond) // the window is the behaviour under test
	r.warn("refused a connection", "10.0.0.1:4002", errWrongSecret)
	all := rec.all()
	last := all[len(all)-1]
	if len(all) != 4 || last.attrs["more_since_last"] != "99" {
		t.Fatalf("after the window: %+v, want a 4th warning with more_since_last=99", all)
	}
	// Closed connections (a port check, a dial given up) are no warning.
	r.warn("refused a connection", "10.0.0.3:1", io.EOF)
	if len(rec.all()) != 4 {
		t.Fatalf("an EOF was logged as a warning: %+v", rec.all())
	}
	if !strings.Contains(last.msg, "refused") {
		t.Fatalf("message %q", last.msg)
	}
	// A refusal this member received from a host is other news than one
	// it made to that host: neither stands for the other.
	r.warn("a peer refused this member's secret", "10.0.0.1:4000", errWrongSecret)
	if got := len(rec.all()); got != 5 {
		t.Fatalf("%d warnings, want 5: a refusal received was hidden by a refusal made to the same host: %+v", got, rec.all())
	}
}

// TestProofDuringRotation: members that hold the old and the new secret
// let in those that hold either, both ways, and answer with a proof under
// the secret the dialer used; once the old secret is dropped, a member
// that holds only it gets nothing, whichever end it is.
func TestProofDuringRotation(t *testing.T) {
	const newSecret = "0123456789abcdef-the-next-secret"
	for _, mode := range authModes(t) {
		t.Run(mode.name, func(t *testing.T) {
			m, _ := testMux(t, mode, 5*time.Second, true)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			dial := func(secrets ...string) error {
				c, err := dialProto(ctx, newCreds(mode.config(t, "dialer"), secrets...), nil, m.ln.Addr().String(), protoAPI)
				if err == nil {
					acceptOne(t, m.api, 5*time.Second)
					c.Close()
				}
				return err
			}
			// The acceptor holds only the old secret: a dialer that
			// proves the new one first falls back to the old.
			if err := dial(newSecret, testSecret); err != nil {
				t.Fatalf("dialer with new and old, acceptor with old: %v", err)
			}
			// The acceptor holds both: dialers with either get in.
			m.creds.setSecrets([]string{newSecret, testSecret})
			for _, s := range []string{testSecret, newSecret} {
				if err := dial(s); err != nil {
					t.Fatalf("dialer with %q, acceptor with both: %v", s, err)
				}
			}
			// The old secret retired: a dialer that holds only it is
			// refused.
			m.creds.setSecrets([]string{newSecret})
			if err := dial(testSecret); !errors.Is(err, ErrSecretRefused) {
				t.Fatalf("dialer with the retired secret: %v, want ErrSecretRefused", err)
			}
			// And as an acceptor, a member that holds only the retired
			// secret cannot answer a dialer that dropped it.
			retired, _ := testMux(t, mode, 5*time.Second, false)
			_, err := dialProto(ctx, newCreds(mode.config(t, "dialer"), newSecret), nil, retired.ln.Addr().String(), protoAPI)
			if !errors.Is(err, ErrSecretRefused) {
				t.Fatalf("dial with the new secret to a member with the retired one: %v, want ErrSecretRefused", err)
			}
		})
	}
}

// TestRetiredSecretEndsItsConnections: a connection proved under a secret
// stays up only while the member holds that secret. Once the secret is
// retired, one opened with it before (by a holder of a leaked secret, say,
// who keeps it alive) is closed, on the acceptor's side and on the
// dialer's, while connections proved under a secret still held stay up.
func TestRetiredSecretEndsItsConnections(t *testing.T) {
	const newSecret = "0123456789abcdef-the-next-secret"
	for _, mode := range authModes(t) {
		t.Run(mode.name, func(t *testing.T) {
			m, _ := testMux(t, mode, 5*time.Second, true)
			m.creds.setSecrets([]string{testSecret, newSecret})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			dialer := newCreds(mode.config(t, "dialer"), testSecret, newSecret)
			// Proved under the old secret, from the acceptor's view.
			old, err := dialProto(ctx, newCreds(mode.config(t, "old"), testSecret), nil, m.ln.Addr().String(), protoAPI)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			acceptOne(t, m.api, 5*time.Second)
			// Proved under the new secret.
			kept, err := dialProto(ctx, newCreds(mode.config(t, "new"), newSecret), nil, m.ln.Addr().String(), protoAPI)
			if err != nil {
				t.Fatal(err)
			}
			defer kept.Close()
			keptServed := acceptOne(t, m.api, 5*time.Second)
			// Dialed under the old secret, from the dialer's view.
			dialed, err := dialProto(ctx, dialer, nil, m.ln.Addr().String(), protoAPI)
			if err != nil {
				t.Fatal(err)
			}
			defer dialed.Close()
			acceptOne(t, m.api, 5*time.Second)

			m.creds.setSecrets([]string{newSecret})
			dialer.setSecrets([]string{newSecret})

			// A read on a closed connection ends at once; the deadline
			// only bounds the failure of this test.
			closed := func(c net.Conn) bool {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := c.Read(make([]byte, 1))
				return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
			}
			if !closed(old) {
				t.Error("the acceptor kept a connection proved under the retired secret")
			}
			if !closed(dialed) {
				t.Error("the dialer kept a connection it proved under the retired secret")
			}
			// The connection under the new secret still carries data.
			if _, err := kept.Write([]byte{'x'}); err != nil {
				t.Fatalf("write on the connection under the new secret: %v", err)
			}
			_ = keptServed.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(keptServed, make([]byte, 1)); err != nil {
				t.Fatalf("the connection under the new secret was cut: %v", err)
			}
		})
	}
}
