package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// writeAtomic replaces path's content at once (a new file renamed over
// it), as an operator's tooling should, so that a member never reads half
// a file.
func writeAtomic(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRotateSecretAndCertificatesWithoutRestart rotates, on a running group
// of three real `baton run` members in CA mode, both the group's secret
// (--secret-file) and its CA with every member's certificate (--tls-*),
// by the procedure of docs/aws.md ("Rotation"), each step reaching every
// member (each logs that it picked it up) before the next:
//
//	secret: OLD | OLD+NEW | NEW+OLD | ... | NEW
//	CA:     CA1 | CA1+CA2 bundle | certificates of CA2 | CA2
//
// No member restarts and no lease is lost: the holder's command started
// once and never stopped, and its token is the lease's throughout. After
// the rotation a new member with only the new secret and a certificate of
// the new CA joins (so the members take the new credentials on new
// connections, both ways); one with only the retired secret is refused
// and exits 2; one whose certificate is of the retired CA never joins.
func TestRotateSecretAndCertificatesWithoutRestart(t *testing.T) {
	t.Parallel()
	const lease = "rotate"
	const oldSecret, newSecret = "old-rotation-secret-0123456789abcdef", "new-rotation-secret-0123456789abcdef"
	dir := t.TempDir()
	tlsFor := func(ca, out string, names ...string) {
		t.Helper()
		if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, ca)); r.code != 0 {
			t.Fatalf("tls ca: %d %s", r.code, r.stderr)
		}
		for _, n := range names {
			if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, ca), "--dir", filepath.Join(dir, out), "--name", n, "--host", "127.0.0.1"); r.code != 0 {
				t.Fatalf("tls cert: %d %s", r.code, r.stderr)
			}
		}
	}
	tlsFor("ca1", "tls1", "m1", "m2", "m3", "late")
	tlsFor("ca2", "tls2", "m1", "m2", "m3", "new", "retired-secret")
	live := filepath.Join(dir, "live")
	if err := os.MkdirAll(live, 0o700); err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(live, "secret")
	writeAtomic(t, secretFile, []byte(oldSecret+"\n"), 0o600)
	caFile := filepath.Join(live, "ca.pem")
	ca1, ca2 := readFile(t, filepath.Join(dir, "tls1", "ca.pem")), readFile(t, filepath.Join(dir, "tls2", "ca.pem"))
	writeAtomic(t, caFile, ca1, 0o644)
	installCert := func(tlsDir, name string) {
		writeAtomic(t, filepath.Join(live, name+"-key.pem"), readFile(t, filepath.Join(dir, tlsDir, name+"-key.pem")), 0o600)
		writeAtomic(t, filepath.Join(live, name+".pem"), readFile(t, filepath.Join(dir, tlsDir, name+".pem")), 0o644)
	}

	events := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, events)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var binds, https []string
	for range 3 {
		binds, https = append(binds, freePort(t)), append(https, freePort(t))
	}
	join := "static:" + strings.Join(binds, ",")
	env := testEnv(childEnv+"=1", childFileEnv+"="+events)
	var members []*batonProc
	for i := range 3 {
		name := fmt.Sprintf("m%d", i+1)
		installCert("tls1", name)
		members = append(members, startBaton(t, name, env, "run", "--backend", "raft://", "--bind", binds[i], "--join", join,
			"--lease", lease, "--id", name, "--http", https[i], "--reload-every", "200ms",
			"--secret-file", secretFile, "--tls-ca", caFile, "--tls-cert", filepath.Join(live, name+".pem"), "--tls-key", filepath.Join(live, name+"-key.pem"),
			"--", self))
	}
	testkit.Eventually(t, 60*time.Second, "the holder's command to start", func() bool { return len(starts(readEvents(events))) >= 1 })
	first := starts(readEvents(events))[0]

	// step waits until every member has logged what for the n-th time.
	step := func(what string, n int) {
		t.Helper()
		for _, m := range members {
			testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%s to log %q %d times", m.name, what, n), func() bool {
				return strings.Count(m.out.String(), what) >= n
			})
		}
	}
	const secretsChanged, tlsReloaded = "the group's secrets changed", "TLS certificates reloaded"

	writeAtomic(t, secretFile, []byte(oldSecret+"\n"+newSecret+"\n"), 0o600) // accept the new one
	step(secretsChanged, 1)
	writeAtomic(t, secretFile, []byte(newSecret+"\n"+oldSecret+"\n"), 0o600) // prove the new one
	step(secretsChanged, 2)
	writeAtomic(t, caFile, append(append([]byte{}, ca1...), ca2...), 0o644) // trust the new CA too
	step(tlsReloaded, 1)
	for i := range 3 {
		installCert("tls2", fmt.Sprintf("m%d", i+1)) // certificates of the new CA
	}
	step(tlsReloaded, 2)
	writeAtomic(t, caFile, ca2, 0o644) // retire the old CA
	step(tlsReloaded, 3)
	writeAtomic(t, secretFile, []byte(newSecret+"\n"), 0o600) // retire the old secret
	step(secretsChanged, 3)

	// A new member with the new credentials only joins.
	installCert("tls2", "new")
	newcomer := startBaton(t, "newcomer", testEnv("BATON_SECRET="+newSecret), "run", "--backend", "raft://", "--bind", "127.0.0.1:0", "--join", join,
		"--lease", lease, "--id", "newcomer", "--bootstrap-expect", "0",
		"--tls-ca", caFile, "--tls-cert", filepath.Join(live, "new.pem"), "--tls-key", filepath.Join(live, "new-key.pem"), "--", "sleep", "600")
	testkit.Eventually(t, 60*time.Second, "the newcomer with the new secret and certificate in the group", func() bool {
		return strings.Contains(newcomer.out.String(), "in the group")
	})

	// One with a certificate of the retired CA, and one with only the
	// retired secret.
	installCert("tls1", "late")
	oldCA := startBaton(t, "old CA", testEnv("BATON_SECRET="+newSecret), "run", "--backend", "raft://", "--bind", "127.0.0.1:0", "--join", join,
		"--lease", lease, "--id", "late", "--bootstrap-expect", "0",
		"--tls-ca", filepath.Join(dir, "tls1", "ca.pem"), "--tls-cert", filepath.Join(live, "late.pem"), "--tls-key", filepath.Join(live, "late-key.pem"), "--", "sleep", "600")
	installCert("tls2", "retired-secret")
	r := runBaton(t, 60*time.Second, "run", "--backend", "raft://", "--bind", "127.0.0.1:0", "--join", join,
		"--lease", lease, "--id", "retired", "--bootstrap-expect", "0", "--secret", oldSecret,
		"--tls-ca", caFile, "--tls-cert", filepath.Join(live, "retired-secret.pem"), "--tls-key", filepath.Join(live, "retired-secret-key.pem"), "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "refused this member's secret") {
		t.Fatalf("a member with only the retired secret: exit %d, want %d refused for its secret; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	if strings.Contains(oldCA.out.String(), "in the group") {
		t.Fatalf("a member with a certificate of the retired CA joined:\n%s", oldCA.out)
	}

	// No lease lost: one command, started once, never stopped, and its
	// token still the lease's.
	evs := readEvents(events)
	if s := starts(evs); len(s) != 1 {
		t.Fatalf("%d commands started, want 1 (the holder's, never restarted): %+v", len(s), s)
	}
	if ev, stopped := stopOf(evs, first.pid); stopped {
		t.Fatalf("the holder's command stopped during the rotation: %+v", ev)
	}
	for _, h := range https {
		code, body := agentCall(t, "GET", "http://"+h+"/v1/leases/"+lease, "")
		if code != http.StatusOK || !strings.Contains(body, fmt.Sprint(first.token)) || !strings.Contains(body, first.holder) {
			t.Fatalf("member %s: lease %d %s; want %s holding with token %d", h, code, body, first.holder, first.token)
		}
	}
	for _, m := range members {
		if strings.Contains(m.out.String(), "term ended") {
			t.Fatalf("%s: a term ended during the rotation:\n%s", m.name, m.out)
		}
	}
}
