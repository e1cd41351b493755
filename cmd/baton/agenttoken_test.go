package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The token file is written only where no other user can swap it, and only
// this user can read it.
func TestWriteAgentToken(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "own", "agent-1.token")
	if _, err := writeAgentToken(good, "tok"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(good); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	if tok, err := readAgentToken(good); err != nil || tok != "tok" {
		t.Fatalf("read back %q, %v", tok, err)
	}

	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	if _, err := writeAgentToken(filepath.Join(open, "agent-1.token"), "tok"); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("a directory anyone may write to: %v, want a refusal", err)
	}

	if os.Geteuid() != 0 {
		return // only root can give a directory to another user
	}
	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := writeAgentToken(filepath.Join(other, "agent-1.token"), "tok"); err == nil || !strings.Contains(err.Error(), "belongs to user 65534") {
		t.Errorf("another user's directory: %v, want a refusal", err)
	}
}
