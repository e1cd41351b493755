package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// namespace is where the tests deploy: the variants' kustomization.yaml
// namespace (TestManifestsParse checks they set one; this test that it is
// this one, by applying them with -k into it).
const namespace = "my-service"

// TestManifestsOnAPIServer applies every manifest here to a real
// kube-apiserver (testserver.StartKubeAPIServer, with RBAC and Pod
// Security admission) with kubectl of the same release, and checks that
// the server accepts them and that the RBAC they grant is what baton
// needs and no more.
func TestManifestsOnAPIServer(t *testing.T) {
	k := testserver.SharedKubeAPIServer(t)
	admin := testserver.NewKubectl(t, k, testserver.KubeAdminUser, namespace)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The namespace enforces (and warns of, and audits) the "restricted"
	// Pod Security Standard: the server warns of a Deployment whose pods
	// it would refuse.
	ns := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %s
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/warn: restricted
    pod-security.kubernetes.io/audit: restricted
`, namespace)
	if _, _, err := admin.Run(ctx, strings.NewReader(ns), "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}

	t.Run("dry run", func(t *testing.T) {
		for _, f := range yamlFiles(t) {
			if filepath.Base(f) == "kustomization.yaml" {
				continue
			}
			t.Run(f, func(t *testing.T) {
				docs, err := parseFile(f)
				if err != nil {
					t.Fatal(err)
				}
				dryRun(ctx, t, admin, len(docs), "-f", f)
			})
		}
		for _, v := range variants {
			t.Run(v, func(t *testing.T) {
				dryRun(ctx, t, admin, -1, "-k", v)
			})
		}
	})

	// The check above must be able to fail: a Deployment whose pods Pod
	// Security would refuse draws a warning, and a misspelt field is
	// refused.
	t.Run("dry run catches", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join("run", "deployment.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ name, old, new string }{
			{"capabilities kept", `drop: ["ALL"]`, `drop: []`},
			{"privilege escalation", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true"},
			{"misspelt field", "readinessProbe:", "readinesProbe:"},
		} {
			t.Run(c.name, func(t *testing.T) {
				bad := strings.Replace(string(data), c.old, c.new, 1)
				if bad == string(data) {
					t.Fatalf("run/deployment.yaml has no %q to change", c.old)
				}
				_, stderr, err := admin.Run(ctx, strings.NewReader(bad), applyDryRun("-f", "-")...)
				if err == nil && !strings.Contains(stderr, "Warning:") {
					t.Errorf("the server took run/deployment.yaml with %q for %q without a warning", c.new, c.old)
				}
			})
		}
	})

	t.Run("rbac", func(t *testing.T) {
		// Applied for real this time: the ServiceAccount must exist for a
		// token to be issued to it, and the Role and RoleBinding for RBAC
		// to grant anything. With -f, not -k: kustomize would fill in the
		// namespace of the RoleBinding's subject, and the file relies on
		// its absence meaning the RoleBinding's own.
		// In a namespace of its own: the dry runs above must find none of
		// it in theirs when the test runs again on the shared server.
		ns := testkit.Unique("rbac")
		admin := testserver.NewKubectl(t, k, testserver.KubeAdminUser, ns)
		if _, _, err := admin.Run(ctx, nil, "create", "namespace", ns); err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := admin.Run(ctx, nil, "apply", "--server-side", "-f", filepath.Join("base", "rbac.yaml")); err != nil {
			t.Fatal(err)
		} else if strings.Contains(stderr, "Warning:") {
			t.Errorf("apply base/rbac.yaml: %s", stderr)
		}
		// The ServiceAccount's own token (TokenRequest), as a pod would
		// have it mounted: authenticated by the server as
		// system:serviceaccount:NAMESPACE:my-service.
		token, _, err := admin.Run(ctx, nil, "create", "token", "my-service", "--duration=10m")
		if err != nil {
			t.Fatal(err)
		}
		sa := &saKubectl{admin: admin, token: strings.TrimSpace(token)}
		whoami, _, err := sa.run(ctx, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
		if err != nil {
			t.Fatal(err)
		}
		if want := "system:serviceaccount:" + ns + ":my-service"; whoami != want {
			t.Fatalf("the token authenticates as %q, want %q", whoami, want)
		}

		for _, c := range []struct {
			args []string
			want bool
		}{
			// What the Kubernetes backend does with its Lease.
			{[]string{"get", "leases.coordination.k8s.io"}, true},
			{[]string{"watch", "leases.coordination.k8s.io"}, true},
			{[]string{"create", "leases.coordination.k8s.io"}, true},
			{[]string{"update", "leases.coordination.k8s.io"}, true},
			// Nothing else on Leases.
			{[]string{"list", "leases.coordination.k8s.io"}, false},
			{[]string{"patch", "leases.coordination.k8s.io"}, false},
			{[]string{"delete", "leases.coordination.k8s.io"}, false},
			{[]string{"deletecollection", "leases.coordination.k8s.io"}, false},
			// Nothing in other namespaces, nothing cluster-wide.
			{[]string{"get", "leases.coordination.k8s.io", "-n", "default"}, false},
			{[]string{"update", "leases.coordination.k8s.io", "-n", "kube-system"}, false},
			{[]string{"create", "leases.coordination.k8s.io", "--all-namespaces"}, false},
			// The leader label: list the pods, patch them.
			{[]string{"list", "pods"}, true},
			{[]string{"patch", "pods"}, true},
			// Nothing else on pods, nor in other namespaces.
			{[]string{"get", "pods"}, false},
			{[]string{"watch", "pods"}, false},
			{[]string{"update", "pods"}, false},
			{[]string{"delete", "pods"}, false},
			{[]string{"create", "pods"}, false},
			{[]string{"patch", "pods", "-n", "default"}, false},
			{[]string{"patch", "pods", "--subresource=status"}, false},
			// Nothing else in its own namespace.
			{[]string{"get", "secrets"}, false},
			{[]string{"get", "configmaps"}, false},
			{[]string{"create", "events"}, false},
		} {
			out, _, err := sa.run(ctx, append([]string{"auth", "can-i"}, c.args...)...)
			var ke *testserver.KubectlError
			if err != nil && !(errors.As(err, &ke) && ke.Status == 1) {
				t.Fatalf("can-i %s: %v", strings.Join(c.args, " "), err) // 1 is "no"
			}
			if got := strings.TrimSpace(out) == "yes"; got != c.want {
				t.Errorf("the ServiceAccount can %s: %s, want %v", strings.Join(c.args, " "), strings.TrimSpace(out), c.want)
			}
		}

		// And the verbs work on a real Lease: create, get, a watch of
		// that one Lease (a field selector on its name, as a waiter
		// watches), update; delete is refused.
		name := testkit.Unique("rbac-check")
		lease := `apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: ` + name + `
spec:
  holderIdentity: %s
  leaseDurationSeconds: 15
`
		if _, _, err := sa.run(ctx, "create", "-f", "-", "--stdin="+fmt.Sprintf(lease, "a")); err != nil {
			t.Fatal(err)
		}
		rv, _, err := sa.run(ctx, "get", "lease", name, "-o", "jsonpath={.metadata.resourceVersion}")
		if err != nil {
			t.Fatal(err)
		}
		watch, _, err := sa.run(ctx, "get", "--raw", "/apis/coordination.k8s.io/v1/namespaces/"+ns+
			"/leases?watch=1&fieldSelector=metadata.name%3D"+name+"&resourceVersion=0&timeoutSeconds=1")
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if !strings.Contains(watch, `"holderIdentity":"a"`) {
			t.Errorf("the watch did not show the Lease: %s", watch)
		}
		updated := strings.Replace(fmt.Sprintf(lease, "b"), "  name: "+name+"\n", "  name: "+name+"\n  resourceVersion: \""+rv+"\"\n", 1)
		if _, _, err := sa.run(ctx, "replace", "-f", "-", "--stdin="+updated); err != nil {
			t.Fatal(err)
		}
		holder, _, err := sa.run(ctx, "get", "lease", name, "-o", "jsonpath={.spec.holderIdentity}")
		if err != nil || holder != "b" {
			t.Fatalf("after the update the holder is %q (%v), want b", holder, err)
		}
		_, stderr, err := sa.run(ctx, "delete", "lease", name)
		if err == nil || !strings.Contains(stderr, "Forbidden") {
			t.Errorf("the ServiceAccount deleted a Lease (err %v): %s", err, stderr)
		}
	})
}

// applyDryRun returns kubectl's arguments for a server-side apply, dry run
// on the server, with strict field validation, of source (-f FILE, -k DIR).
func applyDryRun(source ...string) []string {
	return append([]string{"apply", "--server-side", "--dry-run=server", "--validate=strict", "--field-manager=baton-manifest-test"}, source...)
}

// dryRun applies source with applyDryRun and fails the test if kubectl
// fails, the server warns, or (objects >= 0) it reports other than
// objects objects applied.
func dryRun(ctx context.Context, t *testing.T, c *testserver.Kubectl, objects int, source ...string) {
	t.Helper()
	stdout, stderr, err := c.Run(ctx, nil, applyDryRun(source...)...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr, "Warning:") {
		t.Errorf("the server warned:\n%s", stderr)
	}
	applied := strings.Count(stdout, "(server dry run)")
	if applied == 0 || (objects >= 0 && applied != objects) {
		t.Errorf("applied %d objects, want %d; kubectl said:\n%s%s", applied, objects, stdout, stderr)
	}
}

// saKubectl runs kubectl as the ServiceAccount, with its token in place
// of the admin's.
type saKubectl struct {
	admin *testserver.Kubectl
	token string
}

// run runs kubectl with args; an argument "--stdin=TEXT" is taken out and
// given to kubectl on stdin.
func (s *saKubectl) run(ctx context.Context, args ...string) (string, string, error) {
	var stdin *strings.Reader
	var rest []string
	for _, a := range args {
		if text, ok := strings.CutPrefix(a, "--stdin="); ok {
			stdin = strings.NewReader(text)
			continue
		}
		rest = append(rest, a)
	}
	rest = append([]string{"--token=" + s.token}, rest...)
	if stdin == nil {
		return s.admin.Run(ctx, nil, rest...)
	}
	return s.admin.Run(ctx, stdin, rest...)
}
