package kubernetes

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/batonhq/baton/internal/testserver"
)

// apiClient reads the API server as the administrator over plain HTTP:
// the deploy module has no client-go, and kubectl's start-up is too slow
// for polling.
type apiClient struct {
	host, token string
	hc          *http.Client
}

func newAPIClient(t *testing.T, k *testserver.KubeAPIServer) *apiClient {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(k.CAData()) {
		t.Fatal("the test server's CA does not parse")
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	t.Cleanup(hc.CloseIdleConnections)
	return &apiClient{host: k.Host(), token: k.Token(testserver.KubeAdminUser), hc: hc}
}

// podMeta is what the tests read of a pod.
type podMeta struct {
	Metadata struct {
		Name              string            `json:"name"`
		Labels            map[string]string `json:"labels"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
}

func (c *apiClient) do(ctx context.Context, method, path string, body any, out any) error {
	var rd *strings.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = strings.NewReader(string(b))
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, c.host+path, rd)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, c.host+path, nil)
	}
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	switch method {
	case http.MethodPatch:
		req.Header.Set("Content-Type", "application/merge-patch+json")
	default:
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var msg struct{ Message string }
		_ = json.NewDecoder(resp.Body).Decode(&msg)
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, msg.Message)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// selected returns the names of the pods of ns that selector (a Service's
// selector) picks, sorted.
func (c *apiClient) selected(ctx context.Context, ns string, selector map[string]string) ([]string, error) {
	var list struct{ Items []podMeta }
	if err := c.do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods?labelSelector="+url.QueryEscape(selectorString(selector)), nil, &list); err != nil {
		return nil, err
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Metadata.Name)
	}
	sort.Strings(names)
	return names, nil
}

func selectorString(selector map[string]string) string {
	var parts []string
	for k, v := range selector {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// createPod makes a Pod object named name in ns with labels, as the
// ReplicaSet controller would (no kubelet runs it: the test runs its
// baton), with the manifests' ServiceAccount.
func (c *apiClient) createPod(ctx context.Context, ns, name string, labels map[string]string) error {
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": labels},
		"spec": map[string]any{
			"serviceAccountName": "my-service",
			"containers":         []map[string]any{{"name": "my-service", "image": "registry.example.com/my-service:1.0"}},
		},
	}
	return c.do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", pod, nil)
}

// endpoints returns the names of the pods that the EndpointSlices of
// Service svc in ns list as ready endpoints, sorted; nil when it cannot
// read them.
func (c *apiClient) endpoints(ctx context.Context, ns, svc string) []string {
	var list struct {
		Items []struct {
			Endpoints []struct {
				Conditions struct {
					Ready *bool `json:"ready"`
				} `json:"conditions"`
				TargetRef struct {
					Kind, Name string
				} `json:"targetRef"`
			} `json:"endpoints"`
		} `json:"items"`
	}
	path := "/apis/discovery.k8s.io/v1/namespaces/" + ns + "/endpointslices?labelSelector=" + url.QueryEscape("kubernetes.io/service-name="+svc)
	if err := c.do(ctx, http.MethodGet, path, nil, &list); err != nil {
		return nil
	}
	var names []string
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef.Kind == "Pod" && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				names = append(names, e.TargetRef.Name)
			}
		}
	}
	sort.Strings(names)
	return names
}

// selectorWatch follows the pods of ns with a watch and records the
// largest set that selector picked at once.
type selectorWatch struct {
	mu     sync.Mutex
	picked map[string]bool
	most   []string // the largest set picked at once
	done   chan struct{}
}

// watchSelector starts a selectorWatch, stopped at the test's end.
func (c *apiClient) watchSelector(t *testing.T, ns string, selector map[string]string) *selectorWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.host+"/api/v1/namespaces/"+ns+"/pods?watch=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		t.Fatalf("watch pods: %s", resp.Status)
	}
	w := &selectorWatch{picked: map[string]bool{}, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev struct {
				Type   string  `json:"type"`
				Object podMeta `json:"object"`
			}
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			on := ev.Type != "DELETED"
			for k, v := range selector {
				on = on && ev.Object.Metadata.Labels[k] == v
			}
			w.mu.Lock()
			w.picked[ev.Object.Metadata.Name] = on
			var now []string
			for n, p := range w.picked {
				if p {
					now = append(now, n)
				}
			}
			if len(now) > len(w.most) {
				sort.Strings(now)
				w.most = now
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// mostAtOnce returns the largest set of pods the selector picked at once.
func (w *selectorWatch) mostAtOnce() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.most)
}

// serviceSelector returns the leader Service's selector from
// base/service.yaml.
func serviceSelector(t *testing.T) map[string]string {
	t.Helper()
	for _, m := range loadManifests(t) {
		if m.kind() == "Service" {
			var s service
			m.decode(t, &s)
			return s.Spec.Selector
		}
	}
	t.Fatal("no Service in the manifests")
	return nil
}

// serviceAccountKubeconfig writes a kubeconfig holding a token of the
// manifests' ServiceAccount in ns, as a pod would have it mounted, and
// returns its path.
func serviceAccountKubeconfig(ctx context.Context, t *testing.T, k *testserver.KubeAPIServer, admin *testserver.Kubectl, dir string) string {
	t.Helper()
	token, _, err := admin.Run(ctx, nil, "create", "token", "my-service", "--duration=1h")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: my-service
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: my-service
current-context: test
`, k.Host(), base64.StdEncoding.EncodeToString(k.CAData()), strings.TrimSpace(token)), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}
