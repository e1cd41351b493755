package testkit

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// NobodyUID and NobodyGID are the unprivileged user and group (nobody,
// nogroup) that Unprivileged runs processes as when the test runs as root.
const (
	NobodyUID = 65534
	NobodyGID = 65534
)

// Unprivileged returns the credentials a test gives a child process
// (exec.Cmd.SysProcAttr.Credential) so that it runs as a plain user: nobody
// when the test runs as root, and nil (the test's own user, already plain)
// otherwise. Attacks that an unprivileged local user makes, and code paths
// that differ without root (no writable cgroup), are tested this way both
// as root, in CI, and as a plain user.
func Unprivileged(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: NobodyUID, Gid: NobodyGID, Groups: []uint32{}}
}

// ShareWith makes path, and every directory from it up to the file
// system's root, searchable (and path itself readable) by other users, so
// that a process run with Unprivileged's credentials can execute a binary
// or read a file that the test made in its temporary directory (0700 by
// default). It changes nothing when the test is not root.
func ShareWith(t testing.TB, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatalf("ShareWith %s: %v", path, err)
	}
	for p := abs; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("ShareWith %s: %v", path, err)
		}
		want := st.Mode().Perm() | 0o011
		if p == abs {
			want |= 0o044
		}
		if want != st.Mode().Perm() {
			if err := os.Chmod(p, want); err != nil {
				t.Fatalf("ShareWith %s: %v", path, err)
			}
		}
		if p == filepath.Dir(p) {
			return
		}
	}
}
