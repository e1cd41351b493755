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

// TestKubeAPIServerRestart checks what the chaos harness relies on: after
// Kill the server answers nothing; Restart brings it back (on a new port)
// with the cluster's state, a grant included; Restart with wipe brings it
// back empty, the grant gone.
func TestKubeAPIServerRestart(t *testing.T) {
	k := testserver.StartKubeAPIServer(t)
	const ns = "restart-test"
	if err := k.Grant(t.Context(), ns, testserver.KubeUser, []map[string]any{{
		"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"}, "verbs": []string{"list"},
	}}); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.CAData())
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	// list returns the status of listing the namespace's Leases as
	// KubeUser, or 0 if the server did not answer.
	list := func() int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, k.Host()+"/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+k.Token(testserver.KubeUser))
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := list(); got != http.StatusOK {
		t.Fatalf("list as the granted user: %d; want 200", got)
	}
	k.Kill()
	if got := list(); got != 0 {
		t.Fatalf("list after Kill: %d; want no answer", got)
	}
	if err := k.Restart(false); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != http.StatusOK {
		t.Fatalf("list after Restart: %d; want 200 (the grant kept)", got)
	}
	k.Kill()
	if err := k.Restart(true); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != http.StatusForbidden {
		t.Fatalf("list after Restart with wipe: %d; want 403 (the grant gone)", got)
	}
}
