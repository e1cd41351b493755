package raft

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Every connection between members proves, both ways, that its two ends
// know the group's secret. A certificate of the group's CA is not enough:
// a member's certificate key can leak with the instance that holds it, and
// whoever reaches the CA key can issue more, and neither may admit a
// process that lacks the secret.
//
// After the TLS handshake (TLS 1.3 only) the dialer sends the protocol
// byte and a proof; the acceptor checks it and answers with a status byte
// and, when the proof held, a proof of its own, which the dialer checks.
// A proof is HMAC-SHA256, under a key derived from the secret, of a label,
// the sender's role, the protocol byte and keying material exported from
// this TLS session (RFC 8446 section 7.5). Both ends of one TLS session
// export the same material and no other session does, so a proof seen on
// one connection, or relayed by a machine in the middle that terminates
// TLS itself, is worth nothing on another; and the acceptor reveals its
// proof only to a dialer that proved itself first.
//
// During a rotation a member holds several secrets: it accepts a proof
// under any of them and answers under the one the dialer used; as a
// dialer it proves the first, and on a refusal tries the others in turn,
// each on a new connection (dialProto), so that members a step behind or
// ahead in the rotation still let it in.
//
//	dialer   -> acceptor: proto(1) proof(32)
//	acceptor -> dialer:   authOK(1) proof(32) | authRefused(1) | authRefusedInGroup(1)

const (
	proofLen   = sha256.Size
	keyLabel   = "baton raft connection key v1"
	proofLabel = "baton raft connection proof v1"
	// ekmLabel names the exported keying material; RFC 5705 asks that
	// such labels start with "EXPORTER".
	ekmLabel = "EXPORTER-baton-raft-connection-proof"

	roleDialer   = "dialer"
	roleAcceptor = "acceptor"

	authOK byte = 'Y'
	// authRefused: the dialer's proof did not match.
	authRefused byte = 'N'
	// authRefusedInGroup: the same, from a member that is in a group with
	// a leader. It tells a new member with a wrong secret that it is the
	// one out of step with a live group, not a peer that is still
	// starting, so that it can stop instead of retrying forever.
	authRefusedInGroup byte = 'G'

	// handshakeTimeout bounds the TLS handshake and the exchange of
	// proofs on both sides, so that a peer that stalls holds no
	// goroutine for long.
	handshakeTimeout = 5 * time.Second
)

// ErrSecretRefused is the error of a member whose group refused its
// secret: its BATON_SECRET (NodeOptions.Secret) is not the group's. It is
// a configuration error that retrying cannot fix; Node.Err returns it
// (wrapped) once the member gives up on joining.
var ErrSecretRefused = errors.New("raft: the group refused this member's secret")

// errWrongSecret is the acceptor's side of a refusal: the dialer's proof
// did not match.
var errWrongSecret = errors.New("the peer's proof does not match the group's secret")

// errBadProof is the dialer's side when the acceptor answered with a
// proof that does not match: it is not a member of this group (or is a
// member whose secret differs in a way that let ours pass, which HMAC
// rules out).
var errBadProof = errors.New("the peer answered with a proof that does not match the group's secret")

// refusedError is a dialer's error when the acceptor refused its proof.
type refusedError struct {
	addr    string
	inGroup bool // the refuser is in a group with a leader
}

func (e *refusedError) Error() string {
	if e.inGroup {
		return fmt.Sprintf("%v: %s, a member of a live group, refused it", ErrSecretRefused, e.addr)
	}
	return fmt.Sprintf("%v: %s refused it", ErrSecretRefused, e.addr)
}

func (e *refusedError) Unwrap() error { return ErrSecretRefused }

// connKey is the key that proofs are made with, derived from the group's
// secret so that the secret itself keys nothing but this derivation.
type connKey []byte

func newConnKey(secret string) connKey {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(keyLabel))
	return m.Sum(nil)
}

// proof is role's proof on the TLS session cs for protocol proto.
func (k connKey) proof(cs tls.ConnectionState, role string, proto byte) ([]byte, error) {
	if cs.Version != tls.VersionTLS13 {
		return nil, fmt.Errorf("TLS version %#x: members speak TLS 1.3 only", cs.Version)
	}
	ekm, err := cs.ExportKeyingMaterial(ekmLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("export keying material: %w", err)
	}
	m := hmac.New(sha256.New, k)
	m.Write([]byte(proofLabel))
	m.Write([]byte{0})
	m.Write([]byte(role))
	m.Write([]byte{0, proto})
	m.Write(ekm)
	return m.Sum(nil), nil
}

// dial runs the dialer's side on c, whose TLS handshake is done: it
// proves the secret for proto and checks the acceptor's proof. The caller
// sets c's deadline.
func (k connKey) dial(c *tls.Conn, proto byte) error {
	cs := c.ConnectionState()
	mine, err := k.proof(cs, roleDialer, proto)
	if err != nil {
		return err
	}
	if _, err := c.Write(append([]byte{proto}, mine...)); err != nil {
		return err
	}
	var status [1]byte
	if _, err := io.ReadFull(c, status[:]); err != nil {
		return fmt.Errorf("reading the peer's answer to this member's proof: %w", err)
	}
	switch status[0] {
	case authOK:
	case authRefused, authRefusedInGroup:
		return &refusedError{addr: c.RemoteAddr().String(), inGroup: status[0] == authRefusedInGroup}
	default:
		return fmt.Errorf("the peer answered the proof with %#x: not a baton member of this version", status[0])
	}
	theirs := make([]byte, proofLen)
	if _, err := io.ReadFull(c, theirs); err != nil {
		return fmt.Errorf("reading the peer's proof: %w", err)
	}
	want, err := k.proof(cs, roleAcceptor, proto)
	if err != nil {
		return err
	}
	if !hmac.Equal(theirs, want) {
		return errBadProof
	}
	return nil
}

// accept runs the acceptor's side on c with key k alone; see
// acceptAny.
func (k connKey) accept(c *tls.Conn, inGroup func() bool) (byte, error) {
	proto, _, err := acceptAny(c, []connKey{k}, inGroup)
	return proto, err
}

// acceptAny runs the acceptor's side on c, whose TLS handshake is done,
// and returns the protocol the dialer proved a secret for, and the key of
// that secret. The dialer's
// proof may be under any of keys (during a rotation a member accepts the
// old secret and the new); the answer is a proof under the key the dialer
// used, so that the dialer checks it with the one key it proved. inGroup
// says whether this member is in a group with a leader, for the refusal.
// The caller sets c's deadline.
func acceptAny(c *tls.Conn, keys []connKey, inGroup func() bool) (byte, connKey, error) {
	cs := c.ConnectionState()
	msg := make([]byte, 1+proofLen)
	if _, err := io.ReadFull(c, msg); err != nil {
		return 0, nil, fmt.Errorf("reading the peer's proof: %w", err)
	}
	proto := msg[0]
	if proto != protoRaft && proto != protoAPI {
		return 0, nil, fmt.Errorf("unknown protocol byte %#x", proto)
	}
	var used connKey
	for _, k := range keys {
		want, err := k.proof(cs, roleDialer, proto)
		if err != nil {
			return 0, nil, err
		}
		if hmac.Equal(msg[1:], want) {
			used = k
			break
		}
	}
	if used == nil {
		status := authRefused
		if inGroup() {
			status = authRefusedInGroup
		}
		_, _ = c.Write([]byte{status})
		return 0, nil, errWrongSecret
	}
	mine, err := used.proof(cs, roleAcceptor, proto)
	if err != nil {
		return 0, nil, err
	}
	if _, err := c.Write(append([]byte{authOK}, mine...)); err != nil {
		return 0, nil, err
	}
	return proto, used, nil
}

// creds are what a member proves itself with: its TLS configuration and
// the keys of the secrets it holds, the first the one it proves with
// first. Both can be replaced while the member runs (Node.SetTLS,
// Node.SetSecrets); each connection uses those of the moment it starts.
// A connection lives only as long as the member holds the secret it was
// proved under, whichever end proved first: retiring a secret closes the
// connections proved under it, so that a holder of a retired (perhaps
// leaked) secret cannot keep a connection it opened before. Safe for
// concurrent use.
type creds struct {
	tls  atomic.Pointer[tls.Config]
	keys atomic.Pointer[[]connKey]

	mu    sync.Mutex // orders setSecrets and prove
	conns map[*provenConn]connKey
}

// newCreds holds cfg and the keys of secrets (at least one).
func newCreds(cfg *tls.Config, secrets ...string) *creds {
	c := &creds{conns: map[*provenConn]connKey{}}
	c.setTLS(cfg)
	c.setSecrets(secrets)
	return c
}

func (c *creds) setTLS(cfg *tls.Config) { c.tls.Store(cfg) }

// setSecrets replaces the keys, and closes the connections proved under a
// key no longer among them.
func (c *creds) setSecrets(secrets []string) {
	keys := make([]connKey, 0, len(secrets))
	for _, s := range secrets {
		keys = append(keys, newConnKey(s))
	}
	var retired []*provenConn
	c.mu.Lock()
	c.keys.Store(&keys)
	for pc, k := range c.conns {
		if !holdsKey(keys, k) {
			retired = append(retired, pc)
			delete(c.conns, pc)
		}
	}
	c.mu.Unlock()
	for _, pc := range retired {
		_ = pc.Conn.Close()
	}
}

func (c *creds) tlsConfig() *tls.Config { return c.tls.Load() }

func (c *creds) connKeys() []connKey { return *c.keys.Load() }

// wrap returns raw, the connection under a TLS session, as one that prove
// can tie to the key its session proves.
func (c *creds) wrap(raw net.Conn) *provenConn { return &provenConn{Conn: raw, creds: c} }

// prove records that pc's session proved key k, so that retiring k closes
// it. It reports false, and closes pc, when k was retired meanwhile.
func (c *creds) prove(pc *provenConn, k connKey) bool {
	c.mu.Lock()
	held := holdsKey(c.connKeys(), k)
	if held {
		c.conns[pc] = k
	}
	c.mu.Unlock()
	if !held {
		_ = pc.Conn.Close()
	}
	return held
}

func holdsKey(keys []connKey, k connKey) bool {
	for _, h := range keys {
		if hmac.Equal(h, k) {
			return true
		}
	}
	return false
}

// provenConn is the connection under a TLS session between members; its
// creds close it when the secret its session proved is retired.
type provenConn struct {
	net.Conn
	creds *creds
}

func (pc *provenConn) Close() error {
	pc.creds.mu.Lock()
	delete(pc.creds.conns, pc)
	pc.creds.mu.Unlock()
	return pc.Conn.Close()
}

// failReason sorts a failed connection for the log: "wrong secret",
// "timeout", "tls" (the handshake: a certificate not of the group's CA,
// say) or "protocol" (anything else the peer got wrong).
func failReason(err error) string {
	var re *refusedError
	var hs tlsHandshakeError
	switch {
	case errors.Is(err, errWrongSecret), errors.As(err, &re), errors.Is(err, errBadProof):
		return "wrong secret"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case certProblem(err) == certTheirs:
		return "certificate not signed by the group's CA"
	case certProblem(err) == certOurs:
		return "the peer refused this member's certificate"
	case errors.As(err, &hs):
		return "tls"
	}
	return "protocol"
}

// tlsHandshakeError marks an error of the TLS handshake itself.
type tlsHandshakeError struct{ err error }

func (e tlsHandshakeError) Error() string { return "TLS handshake: " + e.err.Error() }
func (e tlsHandshakeError) Unwrap() error { return e.err }

// quietFailure reports a connection that the peer closed or reset before
// it said anything wrong: a port check, a member giving up on a dial when
// its own deadline passed, or one stopping. These are logged at debug
// level only.
func quietFailure(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, errCut)
}

// refusalLog logs refused connections at warning level, at most once per
// window for each message, peer host and reason (a refusal this member
// made and one it received are different news and never stand for each
// other), so that a peer that connects in a
// loop, or many of them, cannot flood the log; a line says how many
// refusals of its kind it stands for. Safe for concurrent use.
type refusalLog struct {
	log    *slog.Logger
	window time.Duration

	mu   sync.Mutex
	last map[string]refusalEntry // by message, host and reason
}

type refusalEntry struct {
	at         time.Time
	suppressed int
}

// refusalKeys caps the hosts and reasons remembered; past it, refusals of
// new kinds go unlogged until old entries age out of their window.
const refusalKeys = 256

func newRefusalLog(log *slog.Logger, window time.Duration) *refusalLog {
	return &refusalLog{log: log, window: window, last: map[string]refusalEntry{}}
}

// warn logs msg about peer unless one like it was logged within the
// window.
func (r *refusalLog) warn(msg, peer string, err error) {
	if quietFailure(err) {
		r.log.Debug(msg, "peer", peer, "err", err)
		return
	}
	reason := failReason(err)
	host, _, splitErr := net.SplitHostPort(peer)
	if splitErr != nil {
		host = peer
	}
	key := msg + "\x00" + host + "\x00" + reason
	now := time.Now()
	r.mu.Lock()
	e, seen := r.last[key]
	if seen && now.Sub(e.at) < r.window {
		e.suppressed++
		r.last[key] = e
		r.mu.Unlock()
		return
	}
	if !seen && len(r.last) >= refusalKeys {
		for k, old := range r.last {
			if now.Sub(old.at) >= r.window {
				delete(r.last, k)
			}
		}
		if len(r.last) >= refusalKeys {
			r.mu.Unlock()
			return
		}
	}
	r.last[key] = refusalEntry{at: now}
	r.mu.Unlock()
	args := []any{"peer", peer, "reason", reason, "err", err}
	if e.suppressed > 0 {
		args = append(args, "more_since_last", e.suppressed)
	}
	r.log.Warn(msg, args...)
}
