// Package httpauth checks the credentials of `baton agent`'s HTTP API: the
// agent's bearer token, and the per-session secrets of its agent:// clients.
//
// Every check compares SHA-256 digests in constant time: what is compared
// has the same length whatever was presented, so neither the time taken
// nor an early return on a length mismatch tells a caller how long the
// secret is or how much of it they guessed right.
package httpauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"
)

// Digest is the SHA-256 digest of a secret: what a check compares, and what
// may be stored in place of the secret.
type Digest [sha256.Size]byte

// DigestOf returns the digest of secret.
func DigestOf(secret string) Digest { return sha256.Sum256([]byte(secret)) }

// compare is subtle.ConstantTimeCompare; a test watches what it is given.
var compare = subtle.ConstantTimeCompare

// Match reports, in constant time, whether presented is the secret whose
// digest is want.
func Match(presented string, want Digest) bool {
	got := DigestOf(presented)
	return compare(got[:], want[:]) == 1
}

// Bearer checks "Authorization: Bearer TOKEN" against one token. Safe for
// concurrent use.
type Bearer struct {
	want Digest
}

// ErrNoToken is returned by NewBearer for an empty token.
var ErrNoToken = errors.New("httpauth: empty bearer token: every call that changes something must need a credential")

// NewBearer returns a check of token, which must not be empty.
func NewBearer(token string) (*Bearer, error) {
	if token == "" {
		return nil, ErrNoToken
	}
	return &Bearer{want: DigestOf(token)}, nil
}

// Check reports whether r carries the token as "Authorization: Bearer
// TOKEN" (the scheme's case does not matter).
func (b *Bearer) Check(r *http.Request) bool {
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	// Digest even when the scheme is wrong, so that the time taken does
	// not tell either.
	ok := Match(strings.TrimSpace(tok), b.want)
	return ok && strings.EqualFold(scheme, "Bearer")
}

// Require serves next only to requests that pass Check; others get 401
// with a WWW-Authenticate header, answered by deny.
func (b *Bearer) Require(next http.Handler, deny http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !b.Check(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="baton"`)
			deny(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
