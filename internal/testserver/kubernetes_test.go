package testserver_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
)

// TestKubeAPIServerAuth checks what the tests rely on: the server listens
// on 127.0.0.1 only, serves a certificate its CA verifies, refuses
// anonymous requests, lets the admin token do anything, and lets
// KubeUser's token do nothing it was not granted (RBAC).
func TestKubeAPIServerAuth(t *testing.T) {
	k := testserver.StartKubeAPIServer(t)
	host, _, err := net.SplitHostPort(k.Addr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr() = %q; want 127.0.0.1:PORT", k.Addr())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(k.CAData()) {
		t.Fatal("CAData holds no certificate")
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	const leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
	for _, tc := range []struct {
		user string
		want int
	}{
		{"", http.StatusUnauthorized},
		{testserver.KubeAdminUser, http.StatusOK},
		{testserver.KubeUser, http.StatusForbidden},
	} {
		req, err := http.NewRequest(http.MethodGet, k.Host()+leases, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.user != "" {
			req.Header.Set("Authorization", "Bearer "+k.Token(tc.user))
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s as %q: %v", leases, tc.user, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s as %q: %s; want %d", leases, tc.user, resp.Status, tc.want)
		}
	}
}
