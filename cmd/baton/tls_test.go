package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/certs"
	"github.com/batonhq/baton/internal/testkit"
)

// TestTLSKeepsCAKeyOffTheInstances: `baton tls ca` keeps the CA in its own
// directory; `baton tls cert` writes what ships with an instance (its
// certificate, its key and the CA certificate) into another, never the CA
// key, and the shipped files load as a member's TLS configuration.
func TestTLSKeepsCAKeyOffTheInstances(t *testing.T) {
	dir := t.TempDir()
	caDir, ship := filepath.Join(dir, "ca"), filepath.Join(dir, "tls")
	if r := runApp(t.Context(), nil, "tls", "ca", "--dir", caDir); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	if fi, err := os.Stat(caDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the CA directory: %v, %v; want mode 0700", fi, err)
	}
	for _, name := range []string{"web-1", "web-2"} {
		r := runApp(t.Context(), nil, "tls", "cert", "--ca-dir", caDir, "--dir", ship, "--name", name)
		if r.code != 0 {
			t.Fatalf("tls cert %s: %d %s", name, r.code, r.stderr)
		}
	}
	entries, err := os.ReadDir(ship)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"ca.pem", "web-1-key.pem", "web-1.pem", "web-2-key.pem", "web-2.pem"}; !slices.Equal(names, want) {
		t.Fatalf("the shipping directory holds %v, want %v", names, want)
	}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(ship, name))
		if err != nil {
			t.Fatal(err)
		}
		if name != "web-1-key.pem" && name != "web-2-key.pem" && bytes.Contains(b, []byte("PRIVATE KEY")) {
			t.Fatalf("%s holds a private key", name)
		}
	}
	caPEM, _ := os.ReadFile(filepath.Join(caDir, "ca.pem"))
	shipped, _ := os.ReadFile(filepath.Join(ship, "ca.pem"))
	if !bytes.Equal(caPEM, shipped) {
		t.Fatal("the shipped ca.pem is not the CA's certificate")
	}
	if _, err := certs.Load(certs.Files{CA: filepath.Join(ship, "ca.pem"), Cert: filepath.Join(ship, "web-1.pem"), Key: filepath.Join(ship, "web-1-key.pem")}); err != nil {
		t.Fatalf("the shipped files do not load: %v", err)
	}
}

func TestTLSBadFlags(t *testing.T) {
	dir := t.TempDir()
	caDir := filepath.Join(dir, "ca")
	if r := runApp(t.Context(), nil, "tls", "ca", "--dir", caDir); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	other := filepath.Join(dir, "other")
	if r := runApp(t.Context(), nil, "tls", "ca", "--dir", other); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	withOtherCA := filepath.Join(dir, "ship-other")
	if r := runApp(t.Context(), nil, "tls", "cert", "--ca-dir", other, "--dir", withOtherCA, "--name", "x"); r.code != 0 {
		t.Fatalf("tls cert: %d %s", r.code, r.stderr)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"no --ca-dir", []string{"tls", "cert", "--dir", filepath.Join(dir, "s1"), "--name", "web"}, exitUsage, []string{"--ca-dir is required"}},
		{"--dir is the CA's", []string{"tls", "cert", "--ca-dir", caDir, "--dir", caDir + "/.", "--name", "web"}, exitUsage, []string{"is the CA's directory"}},
		{"--dir holds a CA key", []string{"tls", "cert", "--ca-dir", caDir, "--dir", other, "--name", "web"}, exitUsage, []string{"holds ca-key.pem"}},
		{"no CA in --ca-dir", []string{"tls", "cert", "--ca-dir", filepath.Join(dir, "nothing"), "--dir", filepath.Join(dir, "s2"), "--name", "web"}, exitUsage, []string{"baton tls ca --dir"}},
		{"negative cert validity", []string{"tls", "cert", "--ca-dir", caDir, "--dir", filepath.Join(dir, "s3"), "--name", "web", "--valid-for", "-1h"}, exitUsage, []string{"--valid-for -1h0m0s"}},
		{"negative CA validity", []string{"tls", "ca", "--dir", filepath.Join(dir, "ca2"), "--valid-for", "-1h"}, exitUsage, []string{"--valid-for -1h0m0s"}},
		{"another CA's ca.pem in --dir", []string{"tls", "cert", "--ca-dir", caDir, "--dir", withOtherCA, "--name", "web"}, exitFailure, []string{"not this CA's certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runApp(t.Context(), nil, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d; stderr: %s", r.code, tc.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q lacks %q", r.stderr, w)
				}
			}
		})
	}
	// Nothing was written where a flag was refused, and no member key
	// sits beside another CA's certificate.
	for _, p := range []string{filepath.Join(dir, "s1"), filepath.Join(dir, "s3"), filepath.Join(dir, "ca2"), filepath.Join(withOtherCA, "web-key.pem")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists", p)
		}
	}
}

// TestRaftWrongSecretExits: a member whose secret is not its group's is
// refused by the group's member, says so, and exits 2 (a configuration
// error) instead of waiting for a group forever; the group's member logs
// the refusal with the peer's address.
func TestRaftWrongSecretExits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	agent, _, bind := startAgentBind(t, dir)
	r := runBaton(t, 60*time.Second, "run", "--backend", "raft://", "--lease", "x",
		"--bind", "127.0.0.1:0", "--join", "static:"+bind, "--bootstrap-expect", "0",
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "a1.pem"), "--tls-key", filepath.Join(dir, "a1-key.pem"),
		"--secret", "not-the-group-secret-0123456789", "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "refused this member's secret") || !strings.Contains(r.stderr, "BATON_SECRET") {
		t.Fatalf("a member with a wrong secret: exit %d, want %d with an error about the secret; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	testkit.Eventually(t, 10*time.Second, "the agent logging the refused peer", func() bool {
		for line := range strings.Lines(agent.out.String()) {
			if strings.Contains(line, "refused a connection") && strings.Contains(line, "wrong secret") && strings.Contains(line, "127.0.0.1:") {
				return true
			}
		}
		return false
	})
	_ = agent.cmd.Process.Signal(syscall.SIGTERM)
	if code := agent.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("agent exited %d after SIGTERM", code)
	}
}
