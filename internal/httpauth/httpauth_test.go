package httpauth

import (
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The check accepts the token and nothing near it: no prefix, no
// extension, no other scheme, no token differing in its last byte.
func TestBearerCheck(t *testing.T) {
	const token = "s3cret-token-0123456789abcdef"
	b, err := NewBearer(token)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		header string
		ok     bool
	}{
		{"Bearer " + token, true},
		{"bearer " + token, true},
		{"BEARER  " + token + " ", true},
		{"", false},
		{"Bearer", false},
		{"Bearer ", false},
		{token, false},
		{"Basic " + token, false},
		{"Bearer " + token[:len(token)-1], false},
		{"Bearer " + token + "x", false},
		{"Bearer " + token[:len(token)-1] + "g", false},
		{"Bearer " + strings.ToUpper(token), false},
		{"Bearer " + token + token, false},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		if c.header != "" {
			r.Header.Set("Authorization", c.header)
		}
		if got := b.Check(r); got != c.ok {
			t.Errorf("Check(Authorization: %q) = %v, want %v", c.header, got, c.ok)
		}
	}
	if _, err := NewBearer(""); err == nil {
		t.Error("NewBearer(\"\") accepted an empty token")
	}
}

// What is compared is always two digests of the same size, whatever the
// length of what was presented: a compare of unequal lengths returns at
// once, telling the caller the token's length.
func TestCompareSeesOnlyDigests(t *testing.T) {
	var lens [][2]int
	orig := compare
	compare = func(x, y []byte) int {
		lens = append(lens, [2]int{len(x), len(y)})
		return orig(x, y)
	}
	t.Cleanup(func() { compare = orig })
	b, err := NewBearer("the-token")
	if err != nil {
		t.Fatal(err)
	}
	for _, presented := range []string{"", "t", "the-token", "the-token-and-more", strings.Repeat("x", 4096)} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+presented)
		b.Check(r)
		Match(presented, DigestOf("session-secret"))
	}
	if len(lens) != 10 {
		t.Fatalf("compare called %d times, want 10", len(lens))
	}
	for _, l := range lens {
		if l != [2]int{sha256.Size, sha256.Size} {
			t.Fatalf("compare got lengths %v, want two digests of %d bytes", l, sha256.Size)
		}
	}
}

func TestRequire(t *testing.T) {
	b, err := NewBearer("tok")
	if err != nil {
		t.Fatal(err)
	}
	h := b.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusUnauthorized) })
	for _, c := range []struct {
		header string
		want   int
	}{{"Bearer tok", http.StatusNoContent}, {"Bearer to", http.StatusUnauthorized}, {"", http.StatusUnauthorized}} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Authorization", c.header)
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%q: %d, want %d", c.header, w.Code, c.want)
		}
		if w.Code == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%q: 401 without WWW-Authenticate", c.header)
		}
	}
}
