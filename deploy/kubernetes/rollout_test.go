package kubernetes

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// kubelet stands in for the kubelets of a cluster without nodes: for each
// pod of the Deployment that the ReplicaSet controller creates, it runs the
// pod's baton command line (startBaton) and sets the pod's Ready condition
// from the readiness probe, as a kubelet does; when the controller deletes
// a pod (an unscheduled pod is deleted at once), it sends its baton
// SIGTERM, as a kubelet does before it stops a container.
type kubelet struct {
	t          *testing.T
	api        *apiClient
	ns, bin    string
	kubeconfig string
	c          container
	program    []string
	selector   string // the Deployment's pods

	mu   sync.Mutex
	pods map[string]*fakePod
	gone []*fakePod // deleted pods, their baton sent SIGTERM
}

// run syncs the pods every 100 ms until ctx ends.
func (k *kubelet) run(ctx context.Context) {
	ready := map[string]bool{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var list struct{ Items []podMeta }
		err := k.api.do(ctx, http.MethodGet, "/api/v1/namespaces/"+k.ns+"/pods?labelSelector="+k.selector, nil, &list)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			live := map[string]bool{}
			for _, p := range list.Items {
				name := p.Metadata.Name
				live[name] = true
				k.mu.Lock()
				fp := k.pods[name]
				if fp == nil {
					fp = startBaton(k.t, k.bin, k.kubeconfig, k.ns, name, k.c, k.program)
					k.pods[name] = fp
				}
				k.mu.Unlock()
				resp, err := probeClient.Get(fp.http + k.c.ReadinessProbe.HTTPGet.Path)
				ok := err == nil && resp.StatusCode/100 == 2
				if err == nil {
					resp.Body.Close()
				}
				if ok != ready[name] {
					status := "False"
					if ok {
						status = "True"
					}
					patch := map[string]any{"status": map[string]any{"conditions": []map[string]any{{
						"type": "Ready", "status": status, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
					}}}}
					if k.api.do(ctx, http.MethodPatch, "/api/v1/namespaces/"+k.ns+"/pods/"+name+"/status", patch, nil) == nil {
						ready[name] = ok
					}
				}
			}
			k.mu.Lock()
			for name, fp := range k.pods {
				if !live[name] {
					_ = fp.cmd.Process.Signal(syscall.SIGTERM)
					k.gone = append(k.gone, fp)
					delete(k.pods, name)
					delete(ready, name)
				}
			}
			k.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// running returns the names of the pods whose baton runs.
func (k *kubelet) running() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var names []string
	for n := range k.pods {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TestRolloutCompletes runs the Deployment and ReplicaSet controllers of a
// real kube-controller-manager on run/deployment.yaml, three pods, each
// running a real `baton run --backend k8s://` (the kubelet stand-in above
// starts it and sets the pod's Ready condition from its readiness probe),
// and checks with kubectl's own `rollout status` that the Deployment
// becomes available and that a rollout (a change to the pod template, as
// `kubectl rollout restart` makes) completes: every pod is replaced, the
// holder's too, the lease goes to a new pod, and the leader Service's
// selector ends up picking the new holder alone, never two pods at once.
// The same manifest with the readiness probe on /v1/health/leader alone
// (200 for the leader only) never becomes available: rollout status times
// out.
func TestRolloutCompletes(t *testing.T) {
	k := testserver.SharedKubeAPIServer(t)
	testserver.StartKubeControllers(t, k, "deployment-controller", "replicaset-controller")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := buildBaton(ctx, t)
	data, err := os.ReadFile(filepath.Join("run", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const probe = "path: /v1/health/leader?standbyok=true"
	if !strings.Contains(string(data), probe) {
		t.Fatalf("run/deployment.yaml has no readiness probe %q", probe)
	}
	leaderOnly := strings.Replace(string(data), probe, "path: /v1/health/leader", 1)

	for _, tc := range []struct {
		name, manifest string
		completes      bool
	}{
		{"manifest", string(data), true},
		{"leader-only readiness", leaderOnly, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testkit.Unique("rollout")
			admin := testserver.NewKubectl(t, k, testserver.KubeAdminUser, ns)
			kc := func(args ...string) string {
				t.Helper()
				out, _, err := admin.Run(ctx, nil, args...)
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			kc("create", "namespace", ns)
			// The ServiceAccount first: the server refuses pods that name a
			// missing one.
			kc("apply", "--server-side", "-f", filepath.Join("base", "rbac.yaml"))
			kubeconfig := serviceAccountKubeconfig(ctx, t, k, admin, t.TempDir())
			api := newAPIClient(t, k)
			selector := serviceSelector(t)
			watch := api.watchSelector(t, ns, selector)

			var md deployment
			if err := yaml.Unmarshal([]byte(tc.manifest), &md); err != nil {
				t.Fatal(err)
			}
			kl := &kubelet{t: t, api: api, ns: ns, bin: bin, kubeconfig: kubeconfig, c: batonContainer(md),
				program: []string{"sleep", "1000"}, selector: "app.kubernetes.io%2Fname%3Dmy-service", pods: map[string]*fakePod{}}
			kctx, kcancel := context.WithCancel(ctx)
			kdone := make(chan struct{})
			go func() { defer close(kdone); kl.run(kctx) }()
			defer func() { kcancel(); <-kdone }()

			if _, _, err := admin.Run(ctx, strings.NewReader(tc.manifest), "apply", "--server-side", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			rollout := func(timeout string) error {
				_, _, err := admin.Run(ctx, nil, "rollout", "status", "deployment/my-service", "--timeout="+timeout)
				return err
			}
			if !tc.completes {
				// Only the leader is ever Ready: 1 of 3 available.
				if err := rollout("20s"); err == nil {
					t.Fatal("rollout status completed with the readiness probe on the leader check alone")
				}
				return
			}
			if err := rollout("2m"); err != nil {
				t.Fatalf("rollout status of the new Deployment: %v; pods running: %v", err, kl.running())
			}
			first := kl.running()
			if len(first) != 3 {
				t.Fatalf("pods %v, want 3", first)
			}
			holder := api.leaseHolder(ctx, ns, "my-service")
			if !slices.Contains(first, holder) {
				t.Fatalf("the Lease's holder %q is none of the pods %v", holder, first)
			}
			testkit.Eventually(t, time.Minute, "the selector to pick the holder alone", func() bool {
				got, err := api.selected(ctx, ns, selector)
				return err == nil && slices.Equal(got, []string{holder})
			})

			kc("patch", "deployment", "my-service", "--type=merge", "-p", `{"spec":{"template":{"metadata":{"annotations":{"rollout":"2"}}}}}`)
			if err := rollout("3m"); err != nil {
				t.Fatalf("rollout status of the rollout: %v; pods running: %v", err, kl.running())
			}
			// The stand-in kubelet sees the last old pod's deletion at its
			// next sync.
			var now []string
			testkit.Eventually(t, time.Minute, "the old ReplicaSet's pods to be gone, three new ones running", func() bool {
				now = kl.running()
				return len(now) == 3 && !slices.ContainsFunc(now, func(n string) bool { return slices.Contains(first, n) })
			})
			var next string
			testkit.Eventually(t, time.Minute, "a new pod to hold the lease, and the selector to pick it alone", func() bool {
				next = api.leaseHolder(ctx, ns, "my-service")
				got, err := api.selected(ctx, ns, selector)
				return err == nil && slices.Contains(now, next) && slices.Equal(got, []string{next})
			})
			if most := watch.mostAtOnce(); len(most) > 1 {
				t.Errorf("the leader Service's selector picked %v at once", most)
			}
			// Each replaced pod's baton exited 0 on its SIGTERM.
			kl.mu.Lock()
			gone := slices.Clone(kl.gone)
			kl.mu.Unlock()
			for _, p := range gone {
				select {
				case <-p.exited:
					if code := p.cmd.ProcessState.ExitCode(); code != 0 {
						t.Errorf("baton of replaced pod %s exited %d, want 0:\n%s", p.name, code, p.out)
					}
				case <-ctx.Done():
					t.Fatalf("baton of replaced pod %s still runs", p.name)
				}
			}
			t.Logf("rollout: %v replaced by %v; the lease went from %s to %s", first, now, holder, next)
		})
	}
}
