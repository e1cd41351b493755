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
		resp, err := k.adminPost(ctx, hc, o.path, body)
		if err != nil {
			return fmt.Errorf("create %s: %w", o.path, err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("create %s: %s: %s", o.path, resp.Status, answer)
		}
	}
	return k.awaitGrant(ctx, hc, ns, user, rules)
}

// awaitGrant returns once the API server's authorizer lets user do what the
// first of rules allows in ns: RBAC learns of a new RoleBinding from a
// watch, so for a moment after Grant the user is still refused (on a
// loaded machine, long enough for a test's first request).
func (k *KubeAPIServer) awaitGrant(ctx context.Context, hc *http.Client, ns, user string, rules any) error {
	b, err := json.Marshal(rules)
	if err != nil {
		return err
	}
	var rs []struct {
		APIGroups     []string `json:"apiGroups"`
		Resources     []string `json:"resources"`
		ResourceNames []string `json:"resourceNames"`
		Verbs         []string `json:"verbs"`
	}
	if err := json.Unmarshal(b, &rs); err != nil || len(rs) == 0 || len(rs[0].Resources) == 0 || len(rs[0].Verbs) == 0 {
		return nil // nothing granted to wait for
	}
	group, name := "", ""
	if len(rs[0].APIGroups) > 0 {
		group = rs[0].APIGroups[0]
	}
	if len(rs[0].ResourceNames) > 0 {
		name = rs[0].ResourceNames[0]
	}
	review, err := json.Marshal(map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
		"spec": map[string]any{"user": user, "resourceAttributes": map[string]any{
			"namespace": ns, "verb": rs[0].Verbs[0], "group": group, "resource": rs[0].Resources[0], "name": name,
		}},
	})
	if err != nil {
		return err
	}
	for {
		resp, err := k.adminPost(ctx, hc, "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
		if err != nil {
			return fmt.Errorf("access review of %s in %s: %w", user, ns, err)
		}
		var answer struct {
			Status struct {
				Allowed bool `json:"allowed"`
			} `json:"status"`
		}
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("access review of %s in %s: %s (%v)", user, ns, resp.Status, err)
		}
		if answer.Status.Allowed {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the grant to %s in %s did not take effect: %w", user, ns, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// adminPost posts the JSON body to path as the administrator.
func (k *KubeAPIServer) adminPost(ctx context.Context, hc *http.Client, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, k.Host()+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+k.tokens[KubeAdminUser])
	req.Header.Set("Content-Type", "application/json")
	return hc.Do(req)
}

// adminClient returns an HTTP client that trusts the server's CA.
func (k *KubeAPIServer) adminClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.caPEM)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
}
