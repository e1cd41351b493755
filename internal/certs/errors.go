package certs

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"
)

// Sentinel errors naming the kind of problem a *FileError reports; test them
// with errors.Is. Each FileError wraps exactly one of them.
var (
	// ErrMissing reports a file that was not given or does not exist.
	ErrMissing = errors.New("certs: file missing")

	// ErrUnreadable reports a file that exists but cannot be read, for
	// example for lack of permission or because it is a directory.
	ErrUnreadable = errors.New("certs: file unreadable")

	// ErrNotPEM reports a file that holds no PEM block at all, such as an
	// empty file or a DER-encoded one.
	ErrNotPEM = errors.New("certs: file is not PEM")

	// ErrMalformed reports PEM that holds the wrong kind of block (a key where
	// a certificate belongs, say), an encrypted key, or a block that does not
	// parse.
	ErrMalformed = errors.New("certs: malformed PEM contents")

	// ErrNotCA reports a CA file whose certificate is not a CA certificate,
	// which is usually a member certificate given as the CA.
	ErrNotCA = errors.New("certs: not a CA certificate")

	// ErrKeyMismatch reports a private key that is not the key of the
	// certificate it was given with.
	ErrKeyMismatch = errors.New("certs: key does not match certificate")

	// ErrExpired reports a certificate whose NotAfter has passed.
	ErrExpired = errors.New("certs: certificate expired")

	// ErrNotYetValid reports a certificate whose NotBefore is still ahead,
	// most often because this host's clock is behind.
	ErrNotYetValid = errors.New("certs: certificate not yet valid")

	// ErrUntrusted reports a certificate that does not chain to the CA it
	// was loaded with.
	ErrUntrusted = errors.New("certs: certificate not signed by the CA")

	// ErrExtKeyUsage reports a certificate (or a CA above it) whose extended
	// key usage does not allow both TLS server and TLS client auth, which a
	// member needs because it both accepts and dials connections.
	ErrExtKeyUsage = errors.New("certs: certificate lacks TLS server or client auth usage")
)

// Field names, as FileError.Field reports them. A CLI should use the same
// words in its flags' help, so that a message points at what to change.
const (
	FieldCA    = "CA file"
	FieldCert  = "certificate file"
	FieldKey   = "key file"
	FieldCAKey = "CA key file"
)

// FileError reports a problem with one of the files given to Load or LoadCA:
// which file, what is wrong with it, and how to fix it. It wraps one of the
// sentinel kinds (ErrMissing, ErrExpired, ...) and the underlying cause, so
// errors.Is works for both:
//
//	errors.Is(err, certs.ErrExpired)
//	errors.Is(err, fs.ErrNotExist)
type FileError struct {
	// Field names the input, as FieldCA, FieldCert, FieldKey or FieldCAKey.
	Field string
	// File is the path as it was given; empty when the field was not set.
	File string
	// Kind is the sentinel naming the kind of problem, such as ErrExpired.
	Kind error
	// Problem says what is wrong, in words, with the specifics (dates,
	// subjects, PEM block types).
	Problem string
	// Fix says what to do about it.
	Fix string
	// Err is the underlying cause, such as an *fs.PathError or an
	// x509.UnknownAuthorityError; nil when there is none.
	Err error
}

// Error implements error. The message reads
// `certs: <field> "<file>": <problem> (<cause>); <fix>`.
func (e *FileError) Error() string {
	var b strings.Builder
	b.WriteString("certs: ")
	b.WriteString(e.Field)
	if e.File != "" {
		b.WriteString(" ")
		b.WriteString(strconv.Quote(e.File))
	}
	b.WriteString(": ")
	b.WriteString(e.Problem)
	if e.Err != nil {
		cause := e.Err
		// The path is already in the message; say only what the OS said.
		var pe *fs.PathError
		if errors.As(cause, &pe) {
			cause = pe.Err
		}
		b.WriteString(" (")
		b.WriteString(cause.Error())
		b.WriteString(")")
	}
	if e.Fix != "" {
		b.WriteString("; ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// Unwrap returns Kind and, when set, Err, so that errors.Is and errors.As
// see both.
func (e *FileError) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// source names where PEM bytes came from, so that every check can report a
// FileError without threading field and path through each call.
type source struct {
	field, path string
}

func (s source) fail(kind error, problem, fix string, cause error) *FileError {
	return &FileError{Field: s.field, File: s.path, Kind: kind, Problem: problem, Fix: fix, Err: cause}
}
