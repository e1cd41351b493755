package discovery

import "errors"

// Sentinel errors. Errors returned by this package wrap one of them (or an
// error of the resolver underneath), so test them with errors.Is.
var (
	// ErrInvalidSpec is wrapped by Parse errors: an unknown scheme, or a spec
	// whose scheme is known but whose rest is malformed.
	ErrInvalidSpec = errors.New("discovery: invalid spec")

	// ErrInvalidAddress is wrapped by errors about an address that is not
	// "host:port" with a valid host and a port in 1-65535, or about a
	// malformed DNS name. (Failed lookups wrap the resolver's error.)
	ErrInvalidAddress = errors.New("discovery: invalid address")
)
