package testserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Grant makes namespace ns and, in it, a Role "baton" with rules (the
// "rules" of a Role, as JSON: []rbacv1.PolicyRule marshals as is) bound to
// user, as the administrator. A test then runs as user with those rights
// and no others.
func (k *KubeAPIServer) Grant(ctx context.Context, ns, user string, rules any) error {
	const rbac = "rbac.authorization.k8s.io"
	objects := []struct {
		path string
		obj  map[string]any
	}{
		{"/api/v1/namespaces", map[string]any{
			"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
		}},
		{"/apis/" + rbac + "/v1/namespaces/" + ns + "/roles", map[string]any{
			"apiVersion": rbac + "/v1", "kind": "Role",
			"metadata": map[string]any{"name": "baton", "namespace": ns},
			"rules":    rules,
		}},
		{"/apis/" + rbac + "/v1/namespaces/" + ns + "/rolebindings", map[string]any{
			"apiVersion": rbac + "/v1", "kind": "RoleBinding",
			"metadata": map[string]any{"name": "baton", "namespace": ns},
			"roleRef":  map[string]any{"apiGroup": rbac, "kind": "Role", "name": "baton"},
			"subjects": []map[string]any{{"apiGroup": rbac, "kind": "User", "name": user}},
		}},
	}
	hc := k.adminClient()
	defer hc.CloseIdleConnections()
	for _, o := range objects {
		body, err := json.Marshal(o.obj)
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, k.Host()+o.path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+k.tokens[KubeAdminUser])
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("create %s: %w", o.path, err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("create %s: %s: %s", o.path, resp.Status, answer)
		}
	}
	return nil
}

// adminClient returns an HTTP client that trusts the server's CA.
func (k *KubeAPIServer) adminClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.caPEM)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
}
