package kubernetes_test

import (
	"context"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// The tests share one kube-apiserver (testserver.SharedKubeAPIServer), each
// in namespaces and Leases of its own.
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopSharedKubeAPIServer()
	os.Exit(code)
}

// restConfig returns a rest.Config for the test server as user.
func restConfig(srv *testserver.KubeAPIServer, host, user string) *rest.Config {
	return &rest.Config{
		Host:            host,
		BearerToken:     srv.Token(user),
		TLSClientConfig: rest.TLSClientConfig{CAData: srv.CAData()},
	}
}

// TestAPIServerServesLeases checks the test's kube-apiserver: client-go,
// as the admin, creates a coordination.k8s.io/v1 Lease and reads it back,
// and the unprivileged user is refused it by RBAC.
func TestAPIServerServesLeases(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	cs, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeAdminUser))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, holder, secs := testkit.Unique("smoke"), "smoke", int32(15)
	_, err = cs.CoordinationV1().Leases("default").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create lease: %v", err)
	}
	got, err := cs.CoordinationV1().Leases("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	if got.Spec.HolderIdentity == nil || *got.Spec.HolderIdentity != holder || got.Spec.LeaseDurationSeconds == nil || *got.Spec.LeaseDurationSeconds != secs {
		t.Fatalf("lease read back as %+v, want holder %q for %d s", got.Spec, holder, secs)
	}

	user, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeUser))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := user.CoordinationV1().Leases("default").Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Fatalf("user %q read a lease without any RBAC grant", testserver.KubeUser)
	}
}

// resignTerm resigns term within 5 s.
func resignTerm(t *testing.T, term interface {
	Resign(context.Context) error
}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := term.Resign(ctx); err != nil {
		t.Fatalf("resign: %v", err)
	}
}
