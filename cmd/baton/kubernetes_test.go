package main

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// kubeconfigFor makes namespace ns in the shared test kube-apiserver,
// in which testserver.KubeUser may get, watch, create and update Leases
// and do nothing else (the Role of deploy/kubernetes), and writes a
// kubeconfig for that user whose context names no namespace. It returns
// the kubeconfig's path.
func kubeconfigFor(t *testing.T, ns string) string {
	t.Helper()
	file := startKube(t)
	grantLeases(t, ns, []rbacv1.PolicyRule{{
		APIGroups: []string{coordinationv1.GroupName},
		Resources: []string{"leases"},
		Verbs:     []string{"get", "watch", "create", "update"},
	}})
	return file
}

// startKube returns the path of a kubeconfig for testserver.KubeUser on
// the test binary's shared kube-apiserver (started on first use), whose
// context names no namespace. Each test keeps to namespaces of its own.
func startKube(t *testing.T) string {
	t.Helper()
	srv := testserver.SharedKubeAPIServer(t)
	file := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(file, srv.Kubeconfig(srv.Host(), testserver.KubeUser, ""), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// grantLeases makes namespace ns and a Role in it with rules, bound to
// testserver.KubeUser.
func grantLeases(t *testing.T, ns string, rules []rbacv1.PolicyRule) {
	t.Helper()
	if err := testserver.SharedKubeAPIServer(t).Grant(testkit.Context(t, 60*time.Second), ns, testserver.KubeUser, rules); err != nil {
		t.Fatal(err)
	}
}

// k8sURL makes namespace ns (kubeconfigFor) and returns the
// k8s:// backend URL of namespace ns on it, with the kubeconfig in the URL.
func k8sURL(t *testing.T, ns string) string {
	return "k8s://" + ns + "?" + url.Values{"kubeconfig": {kubeconfigFor(t, ns)}}.Encode()
}

// TestKubernetesUsageErrors runs bad k8s:// URLs and lease names in-process:
// each exits 2 with a message that says what is wrong, and none shows a
// password given in the URL.
func TestKubernetesUsageErrors(t *testing.T) {
	t.Parallel()
	// A kubeconfig that names a server but not the context asked for:
	// nothing connects.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
users:
- name: u
  user:
    token: t
contexts:
- name: test
  context:
    cluster: c
    user: u
current-context: test
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want []string // substrings of stderr
	}{
		{"namespace not a DNS label",
			[]string{"is-leader", "--backend", "k8s://Prod_1", "--lease", "x"},
			[]string{`namespace "Prod_1"`, "RFC 1123", "k8s://[NAMESPACE]"}},
		{"a host and port",
			[]string{"is-leader", "--backend", "k8s://10.0.0.1:6443", "--lease", "x"},
			[]string{"a namespace, not a host", "kubeconfig"}},
		{"a path",
			[]string{"leader", "--backend", "k8s://prod/leases", "--lease", "x"},
			[]string{`unexpected path "/leases"`, "k8s://[NAMESPACE]"}},
		{"unknown parameter",
			[]string{"run", "--backend", "k8s://prod?colour=red", "--lease", "x", "--", "true"},
			[]string{`unknown parameter "colour"`, "kubeconfig, context"}},
		{"parameter twice",
			[]string{"cron", "--backend", "k8s://prod?context=a&context=b", "--lease", "x", "--schedule", "@every 1h", "--", "true"},
			[]string{"parameter context given 2 times"}},
		{"credentials in the URL",
			[]string{"is-leader", "--backend", "k8s://admin:pa%25zz@prod", "--lease", "x"},
			[]string{"credentials do not go in the URL", "kubeconfig"}},
		{"credentials in a URL url.Parse refuses",
			[]string{"is-leader", "--backend", "k8s://admin:pa%zz@prod", "--lease", "x"},
			[]string{"credentials do not go in the URL"}},
		{"lease name not a Lease name",
			[]string{"is-leader", "--backend", "k8s://prod", "--lease", "Nightly_Report"},
			[]string{`--lease "Nightly_Report"`, "cannot name a Lease", "RFC 1123"}},
		{"kubeconfig missing",
			[]string{"is-leader", "--backend", "k8s://prod?kubeconfig=/nonexistent/kubeconfig", "--lease", "x", "--timeout", "10s"},
			[]string{"no API server to talk to", "/nonexistent/kubeconfig"}},
		{"context missing",
			[]string{"run", "--backend", "k8s://prod?kubeconfig=" + url.QueryEscape(kubeconfig) + "&context=staging", "--lease", "x", "--", "true"},
			[]string{"no API server to talk to", `"staging"`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runApp(t.Context(), nil, tt.args...)
			checkUsageError(t, r, tt.want)
		})
	}
}

// FuzzParseBackend: any --backend value, parsed as the CLI does (the
// built-in schemes and k8s://), gets a spec or an error, never a panic;
// an error never shows the password of a URL's user information; and a
// k8s:// URL it accepts reads back the same from its String form.
func FuzzParseBackend(f *testing.F) {
	for _, seed := range []string{
		"k8s://", "k8s://prod", "K8S://prod", "k8s://prod/", "k8s://prod?kubeconfig=/etc/kube.yaml&context=ci",
		"k8s://Prod", "k8s://h:6443", "k8s://u:p@prod", "k8s://u:p%zz@prod", "k8s://prod#x", "k8s://prod/x",
		"k8s://prod?kubeconfig=a&kubeconfig=b", "k8s://prod?%zz", "k8s://[::1]", "k8s://-a", "k8s://a.b",
		"etcd://127.0.0.1:2379", "memory://", "zk://u:p@h:2181/x", "consul://h", "mysql://h", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		spec, err := backendurl.Parse(raw, kubernetesScheme("x"))
		if err == nil && spec == nil {
			t.Fatalf("Parse(%q): no spec and no error", raw)
		}
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("Parse(%q): empty error", raw)
			}
			if pw := urlPassword(raw); len(pw) >= 3 && strings.Contains(err.Error(), pw) {
				t.Fatalf("Parse(%q): the error shows the password: %v", raw, err)
			}
			return
		}
		if spec.Scheme != "k8s" {
			return
		}
		u, err := kubernetes.ParseURL(raw)
		if err != nil {
			t.Fatalf("Parse(%q) accepted what kubernetes.ParseURL refuses: %v", raw, err)
		}
		again, err := kubernetes.ParseURL(u.String())
		if err != nil || again != u {
			t.Fatalf("k8s URL %q reads back from %q as %+v (%v), want %+v", raw, u.String(), again, err, u)
		}
	})
}

// urlPassword returns what follows user: in a URL's user information, or
// "".
func urlPassword(raw string) string {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// TestKubernetesAccessRefused: a user the API server's RBAC does not let
// use the Lease, and credentials it rejects, are usage errors (exit 2) that
// say what to grant or fix, found before campaigning, rather than a
// campaign retried forever; the Role of deploy/kubernetes (get, watch,
// create, update) is enough, and so is one that names the Lease.
func TestKubernetesAccessRefused(t *testing.T) {
	t.Parallel()
	kubeconfig := startKube(t)
	grantLeases(t, "granted", []rbacv1.PolicyRule{{
		APIGroups: []string{coordinationv1.GroupName},
		Resources: []string{"leases"},
		Verbs:     []string{"get", "watch", "create", "update"},
	}})
	// A Role that names its Lease: get, watch and update on "nightly"
	// only, and create (which RBAC cannot restrict by name).
	grantLeases(t, "named", []rbacv1.PolicyRule{{
		APIGroups:     []string{coordinationv1.GroupName},
		Resources:     []string{"leases"},
		ResourceNames: []string{"nightly"},
		Verbs:         []string{"get", "watch", "update"},
	}, {
		APIGroups: []string{coordinationv1.GroupName},
		Resources: []string{"leases"},
		Verbs:     []string{"create"},
	}})
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	badToken := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(badToken, regexp.MustCompile(`token: \S+`).ReplaceAll(data, []byte("token: 0123456789abcdef")), 0o600); err != nil {
		t.Fatal(err)
	}
	q := func(file string) string { return url.Values{"kubeconfig": {file}}.Encode() }
	for _, tt := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"granted", []string{"is-leader", "--backend", "k8s://granted?" + q(kubeconfig), "--lease", "x", "--timeout", "30s"},
			exitFailure, nil},
		{"no grant in the namespace", []string{"is-leader", "--backend", "k8s://elsewhere?" + q(kubeconfig), "--lease", "x", "--timeout", "30s"},
			exitUsage, []string{`namespace "elsewhere"`, "get, watch, create, update", "Role"}},
		{"no grant, run", []string{"run", "--backend", "k8s://elsewhere?" + q(kubeconfig), "--lease", "x", "--timeout", "30s", "--", "true"},
			exitUsage, []string{`namespace "elsewhere"`, "Role"}},
		{"a Role naming the lease", []string{"is-leader", "--backend", "k8s://named?" + q(kubeconfig), "--lease", "nightly", "--timeout", "30s"},
			exitFailure, nil},
		{"a Role naming another lease", []string{"is-leader", "--backend", "k8s://named?" + q(kubeconfig), "--lease", "weekly", "--timeout", "30s"},
			exitUsage, []string{`may not get, watch, update lease "weekly"`, `namespace "named"`}},
		{"credentials refused", []string{"leader", "--backend", "k8s://granted?" + q(badToken), "--lease", "x", "--timeout", "30s"},
			exitUsage, []string{"refused this process's credentials", "token"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runApp(t.Context(), nil, tt.args...)
			if r.code != tt.code {
				t.Errorf("exit status %d, want %d; stderr:\n%s", r.code, tt.code, r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

// TestLeaderLabelAccessRefused: run --leader-label for a user whose Role
// grants the Leases but not list and patch on pods is a usage error (exit
// 2) naming the rule to add, found before campaigning.
func TestLeaderLabelAccessRefused(t *testing.T) {
	t.Parallel()
	ns := testkit.Unique("leaderlabel-refused")
	kubeconfig := kubeconfigFor(t, ns)
	r := runApp(t.Context(), map[string]string{"POD_NAME": "my-service-0"}, "run",
		"--backend", "k8s://"+ns+"?"+url.Values{"kubeconfig": {kubeconfig}}.Encode(), "--lease", "x", "--timeout", "30s",
		"--leader-label", "baton.io/leader=x", "--", "true")
	if r.code != exitUsage {
		t.Fatalf("exit status %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	for _, w := range []string{"--leader-label", "may not list, patch pods", `namespace "` + ns + `"`, `resources [pods], verbs [list, patch]`} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, r.stderr)
		}
	}
}
