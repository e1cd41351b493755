package kubernetes_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want kubernetes.URL
	}{
		{"k8s://", kubernetes.URL{}},
		{"k8s:///", kubernetes.URL{}},
		{"k8s://prod", kubernetes.URL{Namespace: "prod"}},
		{"k8s://prod?kubeconfig=/etc/kube/config&context=east", kubernetes.URL{Namespace: "prod", Kubeconfig: "/etc/kube/config", Context: "east"}},
		{"k8s://?context=east", kubernetes.URL{Context: "east"}},
	} {
		got, err := kubernetes.ParseURL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if back, err := kubernetes.ParseURL(got.String()); err != nil || back != got {
			t.Errorf("ParseURL(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
		}
	}
	for _, tc := range []struct{ in, says string }{
		{"etcd://prod", "scheme"},
		{"k8s://Prod", "namespace"},
		{"k8s://prod.example", "namespace"},
		{"k8s://10.0.0.1:6443", "not a host"},
		{"k8s://user:pw@prod", "kubeconfig"},
		{"k8s://prod/leases", "path"},
		{"k8s://prod?namespace=x", "unknown parameter"},
		{"k8s://prod?context=a&context=b", "2 times"},
	} {
		_, err := kubernetes.ParseURL(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), kubernetes.URLForm) {
			t.Errorf("ParseURL(%q) error = %v; want one saying %q and showing the form", tc.in, err, tc.says)
		}
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"k8s://", "k8s://prod?kubeconfig=/a&context=b", "k8s://a:1", "k8s://%zz", "k8s://x?y=%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := kubernetes.ParseURL(s)
		if err != nil {
			return
		}
		back, err := kubernetes.ParseURL(u.String())
		if err != nil || back != u {
			t.Fatalf("ParseURL(%q) = %+v, whose String %q parses as %+v, %v", s, u, u.String(), back, err)
		}
	})
}

func TestCampaignRefusesBadLeaseName(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	b, err := kubernetes.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeAdminUser), kubernetes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CloseAtEnd(t, b, 5*time.Second)
	_, err = b.Campaign(testkit.Context(t, 10*time.Second), "Nightly_Report", baton.Candidate{ID: "a"})
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "Nightly_Report") {
		t.Fatalf("campaign for an invalid Lease name: %v; want a ConfigError naming it", err)
	}
}

// TestOpenFromKubeconfig opens Backends from k8s:// URLs as the CLI would:
// through a kubeconfig named in the URL, and through KUBECONFIG, whose
// context's namespace applies when the URL names none.
func TestOpenFromKubeconfig(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	ns := grantLeases(t, srv, "baton-url")
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, srv.Kubeconfig(srv.Host(), testserver.KubeUser, ns), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", path)
	for _, raw := range []string{"k8s://" + ns + "?kubeconfig=" + path, "k8s://"} {
		u, err := kubernetes.ParseURL(raw)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kubernetes.Open(u, kubernetes.Options{})
		if err != nil {
			t.Fatalf("Open(%s): %v", raw, err)
		}
		testkit.CloseAtEnd(t, b, 5*time.Second)
		if b.Namespace() != ns {
			t.Errorf("Open(%s) namespace = %q, want %q (the context's)", raw, b.Namespace(), ns)
		}
		term := testkit.CampaignWithin(t, b, "url", "a", 30*time.Second)
		rec, err := b.Leader(context.Background(), "url")
		if err != nil || rec.Holder != "a" || rec.Token != term.Token() {
			t.Errorf("Leader = %+v, %v; want holder a with token %d", rec, err, term.Token())
		}
		resignTerm(t, term)
	}
}

// TestParseURLHidesPasswords: a password put in the URL by mistake never
// appears in the error that refuses it, whether the URL parses or not.
func TestParseURLHidesPasswords(t *testing.T) {
	for _, in := range []string{
		"k8s://user:hunter2secret@prod",
		"k8s://user:hunter2secret@prod/path",
		"k8s://user:hunter2secret@pr od%zz",
		"k8s://user:hunter2secret@[::1",
	} {
		_, err := kubernetes.ParseURL(in)
		if err == nil {
			t.Errorf("ParseURL(%q) = nil error, want one", in)
			continue
		}
		if strings.Contains(err.Error(), "hunter2secret") {
			t.Errorf("ParseURL(%q) error shows the password: %v", in, err)
		}
	}
}
