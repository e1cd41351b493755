package raft

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// The secret-only mode (NodeOptions.TLS nil): each member makes a key and a
// self-signed certificate in memory at start, and members do not verify
// each other's certificates against any CA. TLS still encrypts every
// connection (TLS 1.3, ephemeral key exchange), and each end must present
// a certificate; what authenticates a peer is its proof of the group's
// secret (auth.go), bound to the TLS session by exported keying material.
// A machine in the middle that terminates TLS with a certificate of its
// own holds two TLS sessions, one with each member, with different keying
// material: it cannot make a proof for either session without the secret,
// and a proof it relays from one session fails on the other.
//
// What this mode gives up against CA mode: a member does not learn a
// peer's identity from its certificate (any holder of the secret is a
// member), and a dialer sends its proof to whoever answers at a peer's
// address before that end has proved anything. The proof is an HMAC of
// session material under a key derived from the secret, so it reveals the
// secret only to an offline search of guesses: the secret must be random
// (`openssl rand -hex 32`), not a pass phrase.

// selfSignedTLS returns the TLS configuration of a member in secret-only
// mode: a new ECDSA P-256 key and a self-signed certificate, TLS 1.3, a
// certificate required of the peer on both sides and not verified against
// any CA.
func selfSignedTLS(name string) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("raft: make this member's TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("raft: make this member's certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		// Nobody checks these dates; they are wide so that no peer's
		// clock finds the certificate out of its validity, should a
		// library ever look.
		NotBefore:   now.Add(-24 * time.Hour),
		NotAfter:    now.Add(100 * 365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("raft: make this member's certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("raft: make this member's certificate: %w", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// Sent whatever CA names the server asks for: the server verifies
		// no chain, only that a certificate is there.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		ClientAuth:           tls.RequireAnyClientCert,
		// The client checks no chain either (there is no CA to check it
		// against); VerifyConnection still demands a certificate, and the
		// proof of the secret authenticates the peer.
		InsecureSkipVerify: true,
		VerifyConnection:   requirePeerCertificate,
	}, nil
}

// requirePeerCertificate refuses a TLS session in which the peer presented
// no certificate.
func requirePeerCertificate(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the peer presented no certificate")
	}
	return nil
}
