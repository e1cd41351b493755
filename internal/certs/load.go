package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Files names the PEM files of a member's TLS material. All three are
// required; there is no default path.
type Files struct {
	// CA is the group CA certificate. It may hold several CERTIFICATE blocks
	// (an old and a new CA during a CA rotation); peers are accepted if they
	// chain to any of them, and to nothing else.
	CA string
	// Cert is the member's certificate, issued by the group CA, optionally
	// followed by intermediate certificates.
	Cert string
	// Key is the member's unencrypted private key (PKCS #8, SEC 1 or
	// PKCS #1). Keep it mode 0600.
	Key string
}

// Option changes how a config made by Load or CA.Config verifies its peers.
type Option func(*options)

type options struct {
	verifyPeerName bool
}

// VerifyPeerName sets whether a client also requires the server's
// certificate to name the host it dialed (an IP SAN for an IP address, a DNS
// SAN otherwise). The default is false: chain and extended key usage only.
// The package doc explains the trade-off, and what it asks of callers that
// use tls.Client.
func VerifyPeerName(on bool) Option {
	return func(o *options) { o.verifyPeerName = on }
}

// ForPeer returns a clone of cfg whose ServerName is the host of addr
// ("10.0.3.7:7946" gives "10.0.3.7"), unless cfg already names one. Use it
// with tls.Client, which, unlike tls.Dial, does not fill ServerName in, when
// cfg was made with VerifyPeerName(true); in the default mode it is harmless.
func ForPeer(cfg *tls.Config, addr string) *tls.Config {
	c := cfg.Clone()
	if c.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr // no port
		}
		c.ServerName = host
	}
	return c
}

// Load reads f and returns a config that works both as a server config
// (ClientAuth RequireAndVerifyClientCert against the CA) and as a client
// config (server verified against the CA, certificate presented), TLS 1.3
// only. It checks the material first: every problem with a file is reported
// as a *FileError naming it. The files are read once; the returned config is
// safe for concurrent use, and tls.Dial and friends may clone it.
func Load(f Files, opts ...Option) (*tls.Config, error) {
	caSrc := source{FieldCA, f.CA}
	caPEM, err := readFile(caSrc, "the group CA certificate")
	if err != nil {
		return nil, err
	}
	cas, err := parseCAs(caSrc, caPEM)
	if err != nil {
		return nil, err
	}
	certSrc := source{FieldCert, f.Cert}
	certPEM, err := readFile(certSrc, "this member's certificate")
	if err != nil {
		return nil, err
	}
	keySrc := source{FieldKey, f.Key}
	keyPEM, err := readFile(keySrc, "this member's private key")
	if err != nil {
		return nil, err
	}
	chain, err := parseCerts(certSrc, certPEM) // the leaf, then any intermediates
	if err != nil {
		return nil, err
	}
	key, err := parseKey(keySrc, keyPEM)
	if err != nil {
		return nil, err
	}
	if err := matchKey(keySrc, certSrc, chain[0], key); err != nil {
		return nil, err
	}
	if err := checkMember(certSrc, caSrc, chain, cas, time.Now()); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	return newConfig(pool, chain, key, opts), nil
}

// fixes says, per field, how to obtain the file, for "missing" messages.
var fixes = map[string]string{
	FieldCA:    `give the path of the group CA certificate (ca.pem, written by "baton tls" or CA.WriteFiles)`,
	FieldCert:  `give the path of this member's certificate, issued from the group CA (e.g. with "baton tls")`,
	FieldKey:   "give the path of the private key written together with this member's certificate",
	FieldCAKey: "give the path of the CA private key written together with the CA certificate",
}

// readFile reads s.path, reporting a missing or unreadable file. what
// describes the expected contents for the message.
func readFile(s source, what string) ([]byte, error) {
	if s.path == "" {
		return nil, s.fail(ErrMissing, "not set", fixes[s.field], nil)
	}
	data, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, s.fail(ErrMissing, "does not exist", "check the path; "+fixes[s.field], err)
	case err != nil:
		return nil, s.fail(ErrUnreadable, "cannot be read", "make it a regular file holding "+what+", readable by the user baton runs as", err)
	}
	return data, nil
}

// pemBlocks decodes every PEM block in data, and reports data that holds
// none.
func pemBlocks(s source, data []byte) ([]*pem.Block, error) {
	var blocks []*pem.Block
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		blocks = append(blocks, b)
	}
	if len(blocks) > 0 {
		return blocks, nil
	}
	fix := "give a PEM file (text starting with -----BEGIN ...-----)"
	switch {
	case len(strings.TrimSpace(string(data))) == 0:
		return nil, s.fail(ErrNotPEM, "is empty", fix, nil)
	case data[0] == 0x30: // an ASN.1 SEQUENCE: DER
		return nil, s.fail(ErrNotPEM, "is not PEM; it looks like binary DER",
			"convert it, e.g. `openssl x509 -inform der -in FILE -out FILE.pem` (or `openssl pkey -inform der` for a key)", nil)
	}
	return nil, s.fail(ErrNotPEM, "is not PEM: it holds no -----BEGIN ...----- block", fix, nil)
}

// blockTypes lists the types of blocks, for messages.
func blockTypes(blocks []*pem.Block) string {
	types := make([]string, len(blocks))
	for i, b := range blocks {
		types[i] = b.Type
	}
	return strings.Join(types, ", ")
}

// parseCerts returns every CERTIFICATE block of data, in order.
func parseCerts(s source, data []byte) ([]*x509.Certificate, error) {
	blocks, err := pemBlocks(s, data)
	if err != nil {
		return nil, err
	}
	var certs []*x509.Certificate
	for _, b := range blocks {
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, s.fail(ErrMalformed, fmt.Sprintf("certificate %d does not parse", len(certs)+1),
				"replace the file with the certificate as the CA issued it", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		fix := "give a file holding a CERTIFICATE block"
		if strings.Contains(blockTypes(blocks), "PRIVATE KEY") {
			fix = "this looks like a private key; check that the certificate and key paths are not swapped"
		}
		return nil, s.fail(ErrMalformed, "holds no CERTIFICATE block, only "+blockTypes(blocks), fix, nil)
	}
	return certs, nil
}

// parseCAs parses a CA file: one or more CA certificates, all currently
// valid.
func parseCAs(s source, data []byte) ([]*x509.Certificate, error) {
	cas, err := parseCerts(s, data)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for i, c := range cas {
		which := "the CA certificate"
		if len(cas) > 1 {
			which = fmt.Sprintf("CA certificate %d (%s)", i+1, c.Subject)
		}
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, s.fail(ErrNotCA, fmt.Sprintf("%s %q is not a CA certificate (it is probably a member certificate)", which, c.Subject.String()),
				"give the group CA certificate (ca.pem), the one that issued the member certificates", nil)
		}
		if err := checkValidity(s, which, c, now, "create a new group CA and reissue every member's certificate from it"); err != nil {
			return nil, err
		}
	}
	return cas, nil
}

// parseKey parses the first private key in data.
func parseKey(s source, data []byte) (crypto.Signer, error) {
	blocks, err := pemBlocks(s, data)
	if err != nil {
		return nil, err
	}
	for _, b := range blocks {
		if !strings.HasSuffix(b.Type, "PRIVATE KEY") {
			continue
		}
		if b.Type == "ENCRYPTED PRIVATE KEY" || b.Headers["Proc-Type"] != "" {
			return nil, s.fail(ErrMalformed, "holds an encrypted private key",
				"baton cannot prompt for a passphrase; decrypt it (e.g. `openssl pkey -in KEY -out KEY.plain`) and protect it with file mode 0600", nil)
		}
		var key any
		switch b.Type {
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		}
		if err != nil {
			return nil, s.fail(ErrMalformed, fmt.Sprintf("%s block does not parse", b.Type),
				"replace the file with the key as it was generated", err)
		}
		switch k := key.(type) {
		case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
			return k.(crypto.Signer), nil
		}
		return nil, s.fail(ErrMalformed, fmt.Sprintf("holds a %T, which TLS cannot use", key),
			"use an ECDSA, RSA or Ed25519 key", nil)
	}
	fix := "give a file holding a PRIVATE KEY block"
	if strings.Contains(blockTypes(blocks), "CERTIFICATE") {
		fix = "this looks like a certificate; check that the certificate and key paths are not swapped"
	}
	return nil, s.fail(ErrMalformed, "holds no private key, only "+blockTypes(blocks), fix, nil)
}

// matchKey reports a key that is not the certificate's.
func matchKey(keySrc, certSrc source, cert *x509.Certificate, key crypto.Signer) error {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if ok && pub.Equal(cert.PublicKey) {
		return nil
	}
	return keySrc.fail(ErrKeyMismatch,
		fmt.Sprintf("does not match %s %q (subject %q): the certificate's public key is not this key's", certSrc.field, certSrc.path, cert.Subject.String()),
		"use the key that was written together with this certificate, or issue a new certificate and key", nil)
}

// checkValidity reports a certificate outside its validity period at now.
func checkValidity(s source, which string, c *x509.Certificate, now time.Time, renew string) error {
	if now.After(c.NotAfter) {
		return s.fail(ErrExpired,
			fmt.Sprintf("%s expired at %s (it is now %s)", which, c.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)),
			renew, nil)
	}
	if now.Before(c.NotBefore) {
		return s.fail(ErrNotYetValid,
			fmt.Sprintf("%s is not valid until %s (it is now %s)", which, c.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)),
			"check this host's clock (is NTP running?), or wait until then", nil)
	}
	return nil
}

// checkMember checks that chain is a usable member certificate for the CAs
// in pool at now: valid, issued by them, and allowed both TLS roles.
func checkMember(certSrc, caSrc source, chain, cas []*x509.Certificate, now time.Time) error {
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	leaf := chain[0]
	renew := "issue a new certificate from the group CA"
	if err := checkValidity(certSrc, "the certificate", leaf, now, renew); err != nil {
		return err
	}
	verify := func(usage x509.ExtKeyUsage) error {
		opts := x509.VerifyOptions{
			Roots:         pool,
			Intermediates: x509.NewCertPool(),
			CurrentTime:   now,
			KeyUsages:     []x509.ExtKeyUsage{usage},
		}
		for _, c := range chain[1:] {
			opts.Intermediates.AddCert(c)
		}
		_, err := leaf.Verify(opts)
		return err
	}
	if err := verify(x509.ExtKeyUsageAny); err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return certSrc.fail(ErrExpired, "a certificate in its chain has expired or is not yet valid", renew, err)
		}
		return certSrc.fail(ErrUntrusted,
			fmt.Sprintf("is not signed by the CA in %s %q: it was issued by %q, the CA file holds %s", caSrc.field, caSrc.path, leaf.Issuer.String(), subjects(cas)),
			"issue the certificate from this group's CA, or point the CA file at the CA that issued it", err)
	}
	if missing := missingUsages(leaf); missing != "" {
		return certSrc.fail(ErrExtKeyUsage,
			fmt.Sprintf("does not allow %s (its extended key usage is %s); a member both accepts and dials connections, so it needs TLS server auth and TLS client auth", missing, usageNames(leaf)),
			`issue it with "baton tls" or CA.Issue, which set both; with openssl, use "extendedKeyUsage = serverAuth, clientAuth"`, nil)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if err := verify(u); err != nil {
			return certSrc.fail(ErrExtKeyUsage,
				"is allowed TLS server and client auth, but a CA above it restricts its extended key usage",
				"issue member certificates from a CA without an extended key usage restriction", err)
		}
	}
	return nil
}

// missingUsages names the TLS usages that leaf's extended key usage leaves
// out, or returns "". A certificate without the extension is unrestricted,
// as RFC 5280 and crypto/x509 treat it.
func missingUsages(leaf *x509.Certificate) string {
	if len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return ""
	}
	var server, client bool
	for _, u := range leaf.ExtKeyUsage {
		switch u {
		case x509.ExtKeyUsageAny:
			server, client = true, true
		case x509.ExtKeyUsageServerAuth:
			server = true
		case x509.ExtKeyUsageClientAuth:
			client = true
		}
	}
	switch {
	case !server && !client:
		return "TLS server auth or TLS client auth"
	case !server:
		return "TLS server auth"
	case !client:
		return "TLS client auth"
	}
	return ""
}

// subjects lists the subjects of certs, for messages.
func subjects(certs []*x509.Certificate) string {
	out := make([]string, len(certs))
	for i, c := range certs {
		out[i] = strconv.Quote(c.Subject.String())
	}
	return strings.Join(out, ", ")
}

// usageNames describes leaf's extended key usage, for messages.
func usageNames(leaf *x509.Certificate) string {
	names := map[x509.ExtKeyUsage]string{
		x509.ExtKeyUsageAny:             "any",
		x509.ExtKeyUsageServerAuth:      "TLS server auth",
		x509.ExtKeyUsageClientAuth:      "TLS client auth",
		x509.ExtKeyUsageCodeSigning:     "code signing",
		x509.ExtKeyUsageEmailProtection: "email protection",
		x509.ExtKeyUsageTimeStamping:    "time stamping",
		x509.ExtKeyUsageOCSPSigning:     "OCSP signing",
	}
	var out []string
	for _, u := range leaf.ExtKeyUsage {
		if n, ok := names[u]; ok {
			out = append(out, n)
		} else {
			out = append(out, fmt.Sprintf("usage %d", u))
		}
	}
	for _, oid := range leaf.UnknownExtKeyUsage {
		out = append(out, oid.String())
	}
	return strings.Join(out, ", ")
}

// newConfig builds the member config shared by Load and CA.Config.
func newConfig(pool *x509.CertPool, chain []*x509.Certificate, key crypto.Signer, opts []Option) *tls.Config {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cert := tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// Without this a client whose certificate is from another CA sends
		// none (crypto/tls picks only certificates the server's CA list
		// accepts), and the server reports "client didn't provide a
		// certificate" instead of the real problem.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cert, nil
		},
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  pool,
		RootCAs:    pool,
	}
	if !o.verifyPeerName {
		// crypto/tls ties the chain check to a name check; to check the chain
		// without the name, skip its check and do the chain here.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyServer(pool, cs)
		}
	}
	return cfg
}

// verifyServer checks, on the client side, that the server's chain ends at
// the group CA and allows TLS server auth. On the server side crypto/tls has
// already verified the client's chain against ClientCAs (RequireAndVerify),
// which it records in VerifiedChains, so there is nothing left to do.
func verifyServer(pool *x509.CertPool, cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) > 0 {
		return nil
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("certs: peer presented no certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         pool,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		// The same type crypto/tls returns when it verifies, so callers see
		// one error shape in both modes.
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}
