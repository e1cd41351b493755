package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"strings"
	"time"
)

// DefaultCAValidity is how long a CA made by NewCA is valid when validFor is
// zero: long, because replacing a CA means reissuing every member.
const DefaultCAValidity = 10 * 365 * 24 * time.Hour

// DefaultCertValidity is how long a certificate made by Issue is valid when
// validFor is zero, and how long those made by Config are. Certificates are
// never revoked, so this bounds how long a leaked member key stays useful.
const DefaultCertValidity = 365 * 24 * time.Hour

// clockSkew backdates NotBefore, so that a certificate issued on one host is
// already valid on a member whose clock is a little behind.
const clockSkew = 5 * time.Minute

// CA is a group certificate authority: a self-signed CA certificate and its
// private key. It is safe for concurrent use; it never changes after it is
// made.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
}

// NewCA makes a CA with a new ECDSA P-256 key, named commonName and valid
// from now (backdated a few minutes for clock skew) for validFor, or for
// DefaultCAValidity when validFor is zero. It may issue member certificates
// only, not intermediate CAs.
func NewCA(commonName string, validFor time.Duration) (*CA, error) {
	if strings.TrimSpace(commonName) == "" {
		return nil, errors.New("certs: NewCA: commonName is empty; give the CA a name, e.g. \"baton group CA\"")
	}
	if validFor < 0 {
		return nil, fmt.Errorf("certs: NewCA: validFor (%s) is negative; use 0 for the default (%s)", validFor, DefaultCAValidity)
	}
	if validFor == 0 {
		validFor = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: NewCA: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("certs: NewCA: create certificate: %w", err)
	}
	return newCA(der, key)
}

func newCA(der []byte, key crypto.Signer) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parse new certificate: %w", err)
	}
	return &CA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
	}, nil
}

// LoadCA reads a CA certificate and its private key, as written by
// WriteFiles or made by other tools (any ECDSA, RSA or Ed25519 key). Problems
// are reported as *FileError with Field FieldCA or FieldCAKey.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certSrc := source{FieldCA, certFile}
	certPEM, err := readFile(certSrc, "the group CA certificate")
	if err != nil {
		return nil, err
	}
	keySrc := source{FieldCAKey, keyFile}
	keyPEM, err := readFile(keySrc, "the group CA's private key")
	if err != nil {
		return nil, err
	}
	cas, err := parseCAs(certSrc, certPEM)
	if err != nil {
		return nil, err
	}
	if len(cas) != 1 {
		return nil, certSrc.fail(ErrMalformed, fmt.Sprintf("holds %d certificates; a CA that issues must be exactly one", len(cas)),
			"give a file holding only the CA certificate that belongs to the CA key", nil)
	}
	key, err := parseKey(keySrc, keyPEM)
	if err != nil {
		return nil, err
	}
	if err := matchKey(keySrc, certSrc, cas[0], key); err != nil {
		return nil, err
	}
	return newCA(cas[0].Raw, key)
}

// Certificate returns the CA certificate. The caller must not modify it.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// CertPEM returns the CA certificate in PEM: the CA file each member needs.
// It never contains the key.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// WriteFiles writes the CA certificate to certFile (mode 0644) and its
// private key to keyFile (mode 0600), as WritePair does: it refuses to
// overwrite either, because replacing a CA key orphans every certificate it
// issued.
func (ca *CA) WriteFiles(certFile, keyFile string) error {
	keyPEM, err := marshalKey(ca.key)
	if err != nil {
		return err
	}
	return WritePair(certFile, keyFile, ca.certPEM, keyPEM)
}

// WriteCert writes the CA certificate alone, without its key, to certFile
// (mode 0644): the CA file that goes with each member's certificate and
// key to the instances. A file already there that holds this same
// certificate is left as it is; any other file there is an error that
// wraps fs.ErrExist.
func (ca *CA) WriteCert(certFile string) error {
	if certFile == "" {
		return errors.New("certs: WriteCert: a certificate path is required")
	}
	err := writeNew(certFile, ca.certPEM, 0o644)
	if !errors.Is(err, fs.ErrExist) {
		return err
	}
	have, rerr := os.ReadFile(certFile)
	if rerr == nil && bytes.Equal(bytes.TrimSpace(have), bytes.TrimSpace(ca.certPEM)) {
		return nil
	}
	return fmt.Errorf("certs: %s already exists and is not this CA's certificate; remove it first or choose another directory: %w", certFile, fs.ErrExist)
}

// WritePair writes a certificate to certFile (mode 0644) and its private key
// to keyFile (mode 0600; the umask can only tighten these). It refuses to overwrite an
// existing file, reporting an error that wraps fs.ErrExist; remove the old
// files first to replace them. On failure it removes what it wrote.
func WritePair(certFile, keyFile string, certPEM, keyPEM []byte) error {
	if certFile == "" || keyFile == "" {
		return errors.New("certs: WritePair: both a certificate path and a key path are required")
	}
	if certFile == keyFile {
		return fmt.Errorf("certs: WritePair: certificate and key paths are the same (%q); the key must be in its own 0600 file", certFile)
	}
	// The key first: if anything is in the way, nothing is written.
	if err := writeNew(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeNew(certFile, certPEM, 0o644); err != nil {
		_ = os.Remove(keyFile)
		return err
	}
	return nil
}

// writeNew creates path with data and mode, failing if path exists.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("certs: %s already exists; remove it first or choose another path: %w", path, err)
	}
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("certs: write %s: %w", path, err)
	}
	return nil
}

// Issue makes a member certificate and a new ECDSA P-256 key for it, signed
// by ca, and returns both in PEM (the key as PKCS #8). name becomes the
// subject common name. Each host that parses as an IP address goes into the
// IP SANs, every other one into the DNS SANs; hosts may be empty, which suits
// the default mode that does not check peer names. The certificate allows
// both TLS server and client auth, and is valid for validFor (zero means
// DefaultCertValidity), cut short to the CA's own expiry.
func (ca *CA) Issue(name string, hosts []string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	chain, key, err := ca.issueMember(name, hosts, validFor)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = marshalKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: chain[0].Raw}), keyPEM, nil
}

// Config issues a member certificate as Issue does, with
// DefaultCertValidity, and returns a config for it shaped like Load's,
// without touching the file system.
func (ca *CA) Config(name string, hosts []string, opts ...Option) (*tls.Config, error) {
	chain, key, err := ca.issueMember(name, hosts, 0)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return newConfig(pool, chain, key, opts), nil
}

// issueMember validates Issue's arguments and signs a member certificate.
func (ca *CA) issueMember(name string, hosts []string, validFor time.Duration) ([]*x509.Certificate, crypto.Signer, error) {
	if strings.TrimSpace(name) == "" {
		return nil, nil, errors.New("certs: Issue: name is empty; give the member's name, e.g. its node ID")
	}
	if validFor < 0 {
		return nil, nil, fmt.Errorf("certs: Issue: validFor (%s) is negative; use 0 for the default (%s)", validFor, DefaultCertValidity)
	}
	if validFor == 0 {
		validFor = DefaultCertValidity
	}
	ips, dnsNames, err := splitHosts(hosts)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	if !now.Before(ca.cert.NotAfter) {
		return nil, nil, fmt.Errorf("certs: Issue: the CA %q expired at %s; create a new CA: %w",
			ca.cert.Subject.String(), ca.cert.NotAfter.UTC().Format(time.RFC3339), ErrExpired)
	}
	notAfter := now.Add(validFor)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: Issue: generate key: %w", err)
	}
	leaf, err := ca.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: ips,
		DNSNames:    dnsNames,
	}, key.Public())
	if err != nil {
		return nil, nil, err
	}
	return []*x509.Certificate{leaf}, key, nil
}

// sign completes tmpl with a serial number and signs it for pub.
func (ca *CA) sign(tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("certs: Issue: sign certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: Issue: parse new certificate: %w", err)
	}
	return cert, nil
}

// splitHosts sorts hosts into IP and DNS SANs, rejecting what would never
// match a dialed host, such as "10.0.3.7:7946".
func splitHosts(hosts []string) ([]net.IP, []string, error) {
	var ips []net.IP
	var names []string
	for _, h := range hosts {
		bare := strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		if ip := net.ParseIP(bare); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if h == "" || strings.ContainsAny(h, ":/%[] \t\n") {
			return nil, nil, fmt.Errorf("certs: Issue: host %q is neither an IP address nor a DNS name; give hosts without ports or schemes, e.g. \"10.0.3.7\" or \"node-1.example\"", h)
		}
		names = append(names, h)
	}
	return ips, names, nil
}

// newSerial returns a random 128-bit serial number, as RFC 5280 suggests
// for unpredictability.
func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certs: generate serial number: %w", err)
	}
	return serial, nil
}

// marshalKey encodes key as a PKCS #8 PEM block.
func marshalKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
