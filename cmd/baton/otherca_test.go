package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// TestRaftOtherCAExits: in CA mode, a member whose TLS files are another
// CA's (its CA file and its certificate; baton refuses a certificate that
// its own CA file did not sign before starting) is refused with a message
// on both sides and exits 2, as one with a wrong secret does, instead of
// retrying "still not in a group" forever: real `baton run` processes
// beside two `baton agent`s that form the group.
//
//   - While the group is still forming, neither a correct member (c, whose
//     peers are m and the two agents, not started yet) nor the member of
//     the other CA (m) gives up: a peer that is starting refuses nothing,
//     and one misconfigured peer ends nobody.
//   - Once the agents form the group, c joins it, and m exits 2 saying
//     that the peers presented certificates its CA did not sign and naming
//     the flags to fix; the agents log which peer refused their
//     certificate (m's TLS client, which does not trust the group's CA,
//     aborts the handshake with a TLS alert before presenting its own).
func TestRaftOtherCAExits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	other := filepath.Join(dir, "other")
	for _, d := range []string{dir, other} {
		if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(d, "ca")); r.code != 0 {
			t.Fatalf("tls ca: %d %s", r.code, r.stderr)
		}
	}
	cert := func(d, name string) {
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(d, "ca"), "--dir", d, "--name", name, "--host", "127.0.0.1"); r.code != 0 {
			t.Fatalf("tls cert: %d %s", r.code, r.stderr)
		}
	}
	for _, name := range []string{"a1", "a2", "c"} {
		cert(dir, name)
	}
	cert(other, "m")
	const secret = "other-ca-test-secret-0123456789"
	a1, a2, c, m := freePort(t), freePort(t), freePort(t), freePort(t)
	member := func(name, bind, join, ca, certDir string) []string {
		return []string{"run", "--backend", "raft://", "--lease", "other-ca", "--id", name, "--log-level", "debug",
			"--bind", bind, "--join", "static:" + join, "--bootstrap-expect", "0",
			"--tls-ca", ca, "--tls-cert", filepath.Join(certDir, name+".pem"), "--tls-key", filepath.Join(certDir, name+"-key.pem"),
			"--", "sleep", "600"}
	}
	env := testEnv("BATON_SECRET=" + secret)
	groupCA := filepath.Join(dir, "ca.pem")
	cp := startBaton(t, "c", env, member("c", c, strings.Join([]string{a1, a2, m}, ","), groupCA, dir)...)
	mp := startBaton(t, "m", env, member("m", m, strings.Join([]string{a1, a2, c}, ","), filepath.Join(other, "ca.pem"), other)...)
	rounds := func(p *batonProc) int { return strings.Count(p.out.String(), "not in a group yet") }
	testkit.Eventually(t, 60*time.Second, "c and m looking for a group for several rounds", func() bool {
		return rounds(cp) >= 5 && rounds(mp) >= 5
	})
	for _, p := range []*batonProc{cp, mp} {
		select {
		case <-p.done:
			t.Fatalf("%s exited while the group was forming:\n%s", p.name, p.out.String())
		default:
		}
	}
	if !strings.Contains(cp.out.String(), "a peer presented a certificate that this member's CA did not sign") &&
		!strings.Contains(cp.out.String(), "a peer refused this member's certificate") {
		t.Errorf("c did not log m's certificate:\n%s", cp.out.String())
	}

	var agents []*batonProc
	for i, bind := range []string{a1, a2} {
		name := fmt.Sprintf("a%d", i+1)
		agents = append(agents, startBaton(t, name, env, "agent",
			"--bind", bind, "--join", "static:"+a1+","+a2, "--bootstrap-expect", "2", "--voters", "3",
			"--tls-ca", groupCA, "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"),
			"--http", freePort(t), "--log-level", "debug"))
	}
	if code := mp.wait(t, 90*time.Second); code != exitUsage {
		t.Fatalf("m (a certificate of another CA): exit %d, want %d; output:\n%s", code, exitUsage, mp.out.String())
	}
	for _, want := range []string{"refused this member's certificate", "presented certificates that this member's CA did not sign", "--tls-ca", "--tls-cert"} {
		if !strings.Contains(mp.out.String(), want) {
			t.Errorf("m's output does not say %q:\n%s", want, mp.out.String())
		}
	}
	testkit.Eventually(t, 60*time.Second, "c in the group", func() bool { return strings.Contains(cp.out.String(), "in the group") })
	testkit.Eventually(t, 10*time.Second, "an agent logging that m refused its certificate", func() bool {
		for _, a := range agents {
			for line := range strings.Lines(a.out.String()) {
				if strings.Contains(line, "a peer refused this member's certificate") && strings.Contains(line, "127.0.0.1:") {
					return true
				}
			}
		}
		return false
	})
	for _, p := range append(agents, cp) {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range append(agents, cp) {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM:\n%s", p.name, code, p.out.String())
		}
	}
}
