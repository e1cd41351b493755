package raft

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
)

// ErrCertificateRefused is the error of a member whose certificate the
// group refuses, or whose CA does not sign the group's certificates: in CA
// mode its TLS files are not the group's (a certificate of another CA, or
// another --tls-ca); in the secret-only mode, the group is in CA mode. Like
// ErrSecretRefused it is a configuration error that
// retrying cannot fix; Node.Err returns it (wrapped) once the member gives
// up on joining.
var ErrCertificateRefused = errors.New("raft: the group refused this member's certificate")

// certFault says which side of a TLS handshake found a certificate wrong.
type certFault int

const (
	certFine certFault = iota
	// certTheirs: the peer's certificate is not signed by the CA this
	// member trusts.
	certTheirs
	// certOurs: the peer refused this member's certificate (a TLS alert:
	// bad_certificate, unknown_ca, certificate_unknown...).
	certOurs
)

// TLS alert codes about certificates (RFC 8446, section 6).
const (
	alertBadCertificate         = 42
	alertUnsupportedCertificate = 43
	alertCertificateRevoked     = 44
	alertCertificateExpired     = 45
	alertCertificateUnknown     = 46
	alertUnknownCA              = 48
	alertCertificateRequired    = 116
)

// certProblem returns what err, the error of a TLS connection with a peer,
// says about certificates: that the peer's was not signed by our CA, that
// the peer refused ours, or neither.
func certProblem(err error) certFault {
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	if errors.As(err, &cve) || errors.As(err, &uae) {
		return certTheirs
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" && oe.Err != nil {
		// crypto/tls reports a received alert as an OpError whose Err is
		// its unexported alert type, a uint8 holding the code.
		if v := reflect.ValueOf(oe.Err); v.Kind() == reflect.Uint8 {
			switch v.Uint() {
			case alertBadCertificate, alertUnsupportedCertificate, alertCertificateRevoked,
				alertCertificateExpired, alertCertificateUnknown, alertUnknownCA, alertCertificateRequired:
				return certOurs
			}
		}
	}
	return certFine
}

// certRefusedError is a dialer's error when the peers it found refuse its
// certificate, or present ones its CA did not sign.
type certRefusedError struct {
	theirs, ours []string // the peers, by fault
	found        int      // the peers discovery found
	secretOnly   bool     // this member is in the secret-only mode
}

func (e *certRefusedError) Error() string {
	var parts []string
	if len(e.ours) > 0 {
		parts = append(parts, fmt.Sprintf("%s refused its certificate (a TLS alert: it was not signed by their CA)", strings.Join(e.ours, ", ")))
	}
	if len(e.theirs) > 0 {
		parts = append(parts, fmt.Sprintf("%s presented certificates that this member's CA did not sign", strings.Join(e.theirs, ", ")))
	}
	why := "this member's TLS files (CA certificate, certificate and key) are not the group's"
	if e.secretOnly {
		why = "this member runs in the secret-only mode (no TLS files: its certificate is its own) and the group in CA mode; all members of a group use one mode"
	}
	return fmt.Sprintf("%v: %s; that is %d of the %d peers found, a majority, and none let it in: %s",
		ErrCertificateRefused, strings.Join(parts, "; "), len(e.ours)+len(e.theirs), e.found, why)
}

func (e *certRefusedError) Unwrap() error { return ErrCertificateRefused }

// refusalMessage is the log message of a connection the mux refused with
// err: it says which peer presented a certificate the group's CA did not
// sign, or refused this member's, when that is why.
func refusalMessage(err error) string {
	switch certProblem(err) {
	case certTheirs:
		return "refused a peer whose certificate the group's CA did not sign: it is not a member, or its TLS files are another CA's"
	case certOurs:
		return "a peer refused this member's certificate: the peer's CA (--tls-ca) is not this member's"
	}
	return "refused a connection"
}
