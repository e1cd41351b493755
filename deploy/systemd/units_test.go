//go:build linux

// Package systemd tests the systemd units of deploy/systemd: that
// systemd's own verifier takes them, that they hold what docs/install.md
// says of them, and that a stop as systemd does it with
// KillMode=control-group (SIGTERM to every process of the service's
// cgroup) ends baton's term cleanly, with nothing left in the cgroup.
package systemd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

var units = []string{"baton.service", "baton-agent.service"}

// unit is a unit file's settings: section → key → values, in order.
type unit map[string]map[string][]string

// readUnit parses a unit file (comments, sections, Key=Value lines; no
// line continuations, which these files do not use).
func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, `\`) {
				t.Fatalf("%s:%d: %q is no Key=Value in a section", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// get returns the last value of key in [Service] (the one systemd uses),
// or "".
func (u unit) get(key string) string {
	vs := u["Service"][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// buildBaton builds the baton binary into dir.
func buildBaton(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "baton")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/batonhq/baton/cmd/baton").CombinedOutput()
	if err != nil {
		t.Fatalf("build baton: %v\n%s", err, out)
	}
	return bin
}

// verifyRoot makes a file system root for systemd-analyze verify --root:
// the units where a package installs them, baton at /usr/bin/baton, the
// environment file at /etc/baton/baton.env, and the system's own units
// (sysinit.target and the rest that every service depends on).
func verifyRoot(t *testing.T, bin string, unitText map[string]string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string][]byte{} // mode 0644, baton 0755
	for name, text := range unitText {
		files["etc/systemd/system/"+name] = []byte(text)
	}
	env, err := os.ReadFile("baton.env")
	if err != nil {
		t.Fatal(err)
	}
	files["etc/baton/baton.env"] = env
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	files["usr/bin/baton"] = b
	for path, data := range files {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(path, "bin/baton") {
			mode = 0o755
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"/usr/lib/systemd/system", "/lib/systemd/system"} {
		if _, err := os.Stat(filepath.Join(dir, "sysinit.target")); err == nil {
			if err := os.MkdirAll(filepath.Join(root, "usr/lib/systemd"), 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("cp", "-r", dir, filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
				t.Fatalf("copy %s: %v\n%s", dir, err, out)
			}
			break
		}
	}
	return root
}

// verify runs systemd-analyze verify on the units in root, offline (no
// systemd as PID 1 is needed), and returns what it said; systemd-analyze
// exits 0 on a unit with an unknown key or a value it cannot parse, which
// it only warns of, so any output is a finding.
func verify(t *testing.T, root string, names ...string) (string, error) {
	t.Helper()
	args := []string{"verify", "--root=" + root, "--man=no"}
	for _, n := range names {
		args = append(args, "/etc/systemd/system/"+n)
	}
	cmd := exec.Command("systemd-analyze", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// systemdAnalyze skips the test where systemd-analyze is missing (Debian's
// systemd package has it; .ci/run installs it), unless
// BATON_REQUIRE_SERVERS=1.
func systemdAnalyze(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("BATON_REQUIRE_SERVERS") == "1" {
			t.Fatalf("systemd-analyze: %v (install Debian's systemd package)", err)
		}
		t.Skipf("systemd-analyze: %v (install Debian's systemd package)", err)
	}
}

// TestUnitsVerify runs systemd-analyze verify on both units, with baton at
// the path their ExecStart names, and fails on any word from it. The check
// is shown to fail on a misspelt key, a bad KillMode and a missing binary.
func TestUnitsVerify(t *testing.T) {
	systemdAnalyze(t)
	bin := buildBaton(t, t.TempDir())
	text := map[string]string{}
	for _, n := range units {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		text[n] = string(b)
	}
	root := verifyRoot(t, bin, text)
	if out, err := verify(t, root, units...); err != nil || out != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	t.Run("catches", func(t *testing.T) {
		for _, c := range []struct{ name, old, new string }{
			{"misspelt key", "Delegate=yes", "Delgate=yes"},
			{"bad kill mode", "KillMode=control-group", "KillMode=control"},
			{"missing binary", "ExecStart=/usr/bin/baton", "ExecStart=/usr/bin/baton-missing"},
		} {
			t.Run(c.name, func(t *testing.T) {
				bad := strings.Replace(text["baton.service"], c.old, c.new, 1)
				if bad == text["baton.service"] {
					t.Fatalf("baton.service has no %q", c.old)
				}
				root := verifyRoot(t, bin, map[string]string{"baton.service": bad})
				if out, err := verify(t, root, "baton.service"); err == nil && out == "" {
					t.Errorf("systemd-analyze verify took baton.service with %q for %q", c.new, c.old)
				}
			})
		}
	})
}

// shutdownBudget is the longest baton run takes to exit on SIGTERM after
// its command has stopped: the release (5s), the backend's close (5s, then
// at most 5s more) and the HTTP server's (2s), as in
// deploy/kubernetes/manifests_test.go.
const shutdownBudget = (5 + 5 + 5 + 2) * time.Second

// maxDefaultGrace is --grace when it is not given: half the renewal
// window, at most 5s.
const maxDefaultGrace = 5 * time.Second

// TestUnitSettings checks what docs/install.md says of the units: a stop
// that kills the whole cgroup and waits longer than baton's shutdown,
// restarts on failure but not on a usage error, the environment file, the
// delegation the guard's cgroup needs and none of the hardening that would
// take it away; and that every BATON_ variable of baton.env is one that
// the units' commands read (or BATON_COMMAND, the unit's own).
func TestUnitSettings(t *testing.T) {
	for _, n := range units {
		t.Run(n, func(t *testing.T) {
			u := readUnit(t, n)
			for key, want := range map[string]string{
				"KillMode":                 "control-group",
				"KillSignal":               "SIGTERM",
				"Restart":                  "on-failure",
				"RestartPreventExitStatus": "2",
				"EnvironmentFile":          "/etc/baton/baton.env",
				"Type":                     "exec",
			} {
				if got := u.get(key); got != want {
					t.Errorf("%s=%q, want %q", key, got, want)
				}
			}
			stop, err := time.ParseDuration(u.get("TimeoutStopSec"))
			if err != nil {
				t.Fatalf("TimeoutStopSec=%q: %v", u.get("TimeoutStopSec"), err)
			}
			if need := maxDefaultGrace + shutdownBudget; stop <= need {
				t.Errorf("TimeoutStopSec=%s: baton may need --grace %s + %s to stop its command, release the lease and exit", stop, maxDefaultGrace, shutdownBudget)
			}
			if !strings.HasPrefix(u.get("ExecStart"), "/usr/bin/baton ") {
				t.Errorf("ExecStart=%q: want /usr/bin/baton, where the package installs it", u.get("ExecStart"))
			}
			if n != "baton.service" {
				return
			}
			if u.get("ExecStart") != "/usr/bin/baton run -- $BATON_COMMAND" {
				t.Errorf("ExecStart=%q", u.get("ExecStart"))
			}
			if u.get("Delegate") != "yes" {
				t.Error("Delegate is not yes: the guard may not make the command's cgroup below the service's")
			}
			for _, key := range []string{"ProtectControlGroups", "RestrictNamespaces", "PrivateUsers"} {
				if v := u.get(key); v != "" && v != "no" {
					t.Errorf("%s=%s: takes the command's cgroup from the guard (docs/install.md)", key, v)
				}
			}
		})
	}

	// The variables of baton.env against the flags' [$BATON_...] marks.
	bin := buildBaton(t, t.TempDir())
	read := map[string]bool{"BATON_COMMAND": true}
	mark := regexp.MustCompile(`\[\$(BATON_[A-Z0-9_]+)\]`)
	for _, cmd := range []string{"run", "agent"} {
		out, err := exec.Command(bin, cmd, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("baton %s --help: %v\n%s", cmd, err, out)
		}
		for _, m := range mark.FindAllStringSubmatch(string(out), -1) {
			read[m[1]] = true
		}
	}
	env, err := os.ReadFile("baton.env")
	if err != nil {
		t.Fatal(err)
	}
	set := regexp.MustCompile(`(?m)^#?(BATON_[A-Z0-9_]+)=`)
	vars := set.FindAllStringSubmatch(string(env), -1)
	if len(vars) < 10 {
		t.Fatalf("baton.env names %d variables", len(vars))
	}
	for _, m := range vars {
		if !read[m[1]] {
			t.Errorf("baton.env sets %s, which neither baton run nor baton agent reads", m[1])
		}
	}
	for _, want := range []string{"BATON_BACKEND", "BATON_LEASE", "BATON_GRACE", "BATON_COMMAND"} {
		if !slices.ContainsFunc(vars, func(m []string) bool { return m[1] == want }) {
			t.Errorf("baton.env does not mention %s", want)
		}
	}
}

// cgroup2 returns the directory of this process's cgroup in the cgroup v2
// hierarchy, or "".
func cgroup2() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	mount, root := "", ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if i := slices.Index(f, "-"); i > 4 && i+1 < len(f) && f[i+1] == "cgroup2" {
			mount, root = f[4], f[3]
			break
		}
	}
	if mount == "" {
		return ""
	}
	b, err = os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel, ok := strings.CutPrefix(p, root)
			if !ok {
				return ""
			}
			return filepath.Join(mount, rel)
		}
	}
	return ""
}

// procs returns the processes in cgroup dir and every cgroup below it.
func procs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// TestControlGroupStop stops `baton run` as systemd stops baton.service,
// without systemd (it is not PID 1 here): baton is started in a cgroup of
// its own, as the service's, and the guard makes the command's cgroup
// below it, as Delegate=yes allows; then every process of that cgroup tree
// gets SIGTERM and SIGCONT at once, as KillMode=control-group sends them.
// The command (a shell that notes SIGTERM and goes on, with a background
// sleep) gets SIGTERM, the guard kills it and its child after --grace,
// baton exits 0 within the unit's TimeoutStopSec, having released the
// lease, and the cgroup is empty by then: systemd's final SIGKILL would
// find nothing. Needs root (or a delegated
// cgroup) and cgroup v2.
func TestControlGroupStop(t *testing.T) {
	own := cgroup2()
	if own == "" {
		t.Skip("no cgroup v2 hierarchy")
	}
	svc := filepath.Join(own, fmt.Sprintf("baton-unit-test-%d", os.Getpid()))
	if err := os.Mkdir(svc, 0o755); err != nil {
		t.Skipf("cannot make a cgroup for the service (%v): needs root or a delegated cgroup", err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(svc, "cgroup.kill"), []byte("1"), 0)
		for i := 0; i < 100; i++ {
			children, _ := filepath.Glob(filepath.Join(svc, "baton-guard-*"))
			for _, c := range children {
				_ = os.Remove(c)
			}
			if os.Remove(svc) == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("could not remove the test's cgroup %s", svc)
	})
	stop, err := time.ParseDuration(readUnit(t, "baton.service").get("TimeoutStopSec"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := buildBaton(t, dir)
	marks := filepath.Join(dir, "marks")
	fd, err := os.Open(svc)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	// A file, as systemd's journal stream is one: baton then keeps a
	// spare guard ready for the next term, one more process to stop.
	out, err := os.Create(filepath.Join(dir, "baton.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	log := func() string { b, _ := os.ReadFile(out.Name()); return string(b) }
	// A command that notes each SIGTERM and goes on, so that the guard's
	// SIGKILL (after --grace, through the command's cgroup) must end it
	// and the child it started in the background.
	cmd := exec.Command(bin, "run", "--", "sh", "-c",
		`trap 'echo got-term >> `+marks+`' TERM; sleep 1000 & echo started >> `+marks+`; while :; do sleep 0.05; done`)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "BATON_BACKEND=memory://", "BATON_LEASE=unit-test", "BATON_GRACE=2s"}
	cmd.Stdout, cmd.Stderr = out, out
	// In the service's cgroup from its first instruction, as systemd
	// starts ExecStart.
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd()), Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if t.Failed() {
			t.Logf("baton:\n%s", log())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		b, _ := os.ReadFile(marks)
		guards, _ := filepath.Glob(filepath.Join(svc, "baton-guard-*"))
		// baton, the guard and the spare guard, the shell and its sleep.
		if strings.Contains(string(b), "started") && len(guards) > 0 && len(procs(svc)) >= 5 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("baton exited before the command started: %v", err)
		case <-ctx.Done():
			t.Fatalf("the command did not start in a guard's cgroup below the service's, beside a spare guard (marks %q, guard cgroups %v, processes %v)", b, guards, procs(svc))
		case <-time.After(10 * time.Millisecond):
		}
	}
	before := procs(svc)

	// systemd's stop: SIGTERM, then SIGCONT, to every process of the
	// cgroup tree.
	stopped := time.Now()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGCONT} {
		for _, pid := range procs(svc) {
			_ = syscall.Kill(pid, sig)
		}
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("baton exited %d after the cgroup's SIGTERM, want 0", ee.ExitCode())
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(stop):
		t.Fatalf("baton still runs %s (TimeoutStopSec) after the cgroup's SIGTERM: systemd would SIGKILL it", stop)
	}
	took := time.Since(stopped)
	if left := procs(svc); len(left) > 0 {
		t.Errorf("processes left in the service's cgroup after baton exited: %v (systemd's SIGKILL would be needed)", left)
	}
	if guards, _ := filepath.Glob(filepath.Join(svc, "baton-guard-*")); len(guards) > 0 {
		t.Errorf("the guard's cgroup outlived it: %v", guards)
	}
	b, _ := os.ReadFile(marks)
	terms := strings.Count(string(b), "got-term")
	if terms == 0 {
		t.Errorf("the command never got SIGTERM: %q", b)
	}
	if l := log(); !strings.Contains(l, "term ended") || !strings.Contains(l, "resigned") {
		t.Errorf("baton did not release the lease (no \"term ended ... resigned\" in its log)")
	}
	// systemd's SIGTERM and the guard's both reach the command, unless
	// they coalesce while the first is pending (docs/install.md).
	t.Logf("stopped in %s (the command ignoring SIGTERM, killed after --grace 2s); processes in the service's cgroup before: %d; SIGTERMs the command saw: %d",
		took.Round(time.Millisecond), len(before), terms)
}
