package raft

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// ParseSecrets reads a secret file as editors and tools write it: CRLF line
// ends, blank lines, white space around a line, a UTF-8 byte order mark
// (Notepad, PowerShell's Out-File) are not part of any secret; a value
// with no secret, or a short one, is an error that names it.
func TestParseSecrets(t *testing.T) {
	const a, b = "0123456789abcdef-secret-a", "0123456789abcdef-secret-b"
	for _, tc := range []struct {
		name, text string
		want       []string // nil: an error, containing errHas
		errHas     string
	}{
		{"one", a, []string{a}, ""},
		{"trailing newline", a + "\n", []string{a}, ""},
		{"CRLF", a + "\r\n" + b + "\r\n", []string{a, b}, ""},
		{"blank lines and spaces", "\n\n  " + a + "\t\n\n " + b + " \n\n", []string{a, b}, ""},
		{"byte order mark", "\ufeff" + a + "\r\n", []string{a}, ""},
		{"byte order mark, two secrets", "\ufeff" + a + "\n" + b, []string{a, b}, ""},
		{"empty", "", nil, "no secret"},
		{"white space only", " \r\n\t\n", nil, "no secret"},
		{"byte order mark only", "\ufeff\r\n", nil, "no secret"},
		{"short", a + "\nshort\n", nil, "secret 2 of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret, previous, err := ParseSecrets(tc.text)
			if tc.want == nil {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("ParseSecrets(%q) = %q, %q, %v; want an error containing %q", tc.text, secret, previous, err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSecrets(%q): %v", tc.text, err)
			}
			if got := append([]string{secret}, previous...); !slices.Equal(got, tc.want) {
				t.Fatalf("ParseSecrets(%q) = %q, want %q", tc.text, got, tc.want)
			}
		})
	}
	// And as a file.
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte("\ufeff"+a+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if secret, _, err := ReadSecretFile(path); err != nil || secret != a {
		t.Fatalf("ReadSecretFile of a file with a byte order mark and CRLF: %q, %v; want %q", secret, err, a)
	}
}
