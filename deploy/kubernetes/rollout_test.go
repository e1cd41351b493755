package kubernetes

import (
	"context"
	"fmt"
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

// kubelet stands in for the scheduler and the kubelet of a cluster whose
// one Node is an API object: for each pod of the Deployment that the
// ReplicaSet controller creates, it binds the pod to the node, runs the
// pod's baton command line (startBaton), and reports the pod Running with
// an IP and its Ready condition from the readiness probe, as a kubelet
// does; when the controller deletes a pod, it sends its baton SIGTERM, as a
// kubelet stops a container, and confirms the deletion once it has exited.
type kubelet struct {
	t          *testing.T
	api        *apiClient
	ns, bin    string
	kubeconfig string
	c          container
	program    []string
	selector   string // the Deployment's pods
	node       string // the Node object the pods are bound to

	mu   sync.Mutex
	pods map[string]*fakePod
	gone []*fakePod // deleted pods, their baton sent SIGTERM
	ips  int        // pod IPs handed out: 10.244.0.1, .2, ...
}

// run syncs the pods every 100 ms until ctx ends.
func (k *kubelet) run(ctx context.Context) {
	ready := map[string]bool{}
	ip := map[string]string{}
	stopping := map[string]*fakePod{} // deleted gracefully, baton sent SIGTERM
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
				if p.Metadata.DeletionTimestamp != nil {
					// Deleted gracefully (a bound pod): SIGTERM to its
					// baton, as a kubelet stops the container, and once it
					// has exited, the deletion confirmed.
					k.mu.Lock()
					if fp := k.pods[name]; fp != nil {
						_ = fp.cmd.Process.Signal(syscall.SIGTERM)
						k.gone = append(k.gone, fp)
						delete(k.pods, name)
						stopping[name] = fp
					}
					k.mu.Unlock()
					done := true
					if fp := stopping[name]; fp != nil {
						select {
						case <-fp.exited:
						default:
							done = false
						}
					}
					if done {
						_ = k.api.do(ctx, http.MethodDelete, "/api/v1/namespaces/"+k.ns+"/pods/"+name, map[string]any{"gracePeriodSeconds": 0}, nil)
					}
					continue
				}
				live[name] = true
				if p.Spec.NodeName == "" {
					// The scheduler's part: bind it to the node.
					binding := map[string]any{"apiVersion": "v1", "kind": "Binding", "metadata": map[string]any{"name": name},
						"target": map[string]any{"apiVersion": "v1", "kind": "Node", "name": k.node}}
					if err := k.api.do(ctx, http.MethodPost, "/api/v1/namespaces/"+k.ns+"/pods/"+name+"/binding", binding, nil); err != nil {
						continue
					}
				}
				k.mu.Lock()
				fp := k.pods[name]
				if fp == nil {
					fp = startBaton(k.t, k.bin, os.Getenv("PATH"), k.kubeconfig, k.ns, name, k.c, k.program)
					k.pods[name] = fp
				}
				k.mu.Unlock()
				resp, err := probeClient.Get(fp.http + k.c.ReadinessProbe.HTTPGet.Path)
				ok := err == nil && resp.StatusCode/100 == 2
				if err == nil {
					resp.Body.Close()
				}
				if _, seen := ip[name]; !seen || ok != ready[name] {
					status := "False"
					if ok {
						status = "True"
					}
					// An IP, as a kubelet reports its pod's: the EndpointSlice
					// controller lists no pod without one.
					if !seen {
						k.ips++
						ip[name] = fmt.Sprintf("10.244.0.%d", k.ips)
					}
					patch := map[string]any{"status": map[string]any{
						"phase": "Running", "podIP": ip[name], "podIPs": []map[string]any{{"ip": ip[name]}},
						"conditions": []map[string]any{{
							"type": "Ready", "status": status, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
						}},
					}}
					if k.api.do(ctx, http.MethodPatch, "/api/v1/namespaces/"+k.ns+"/pods/"+name+"/status", patch, nil) == nil {
						ready[name] = ok
					} else if !seen {
						delete(ip, name)
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
					delete(ip, name)
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
// The EndpointSlice controller runs too (the stand-in kubelet gives each
// pod an IP), and the leader Service's EndpointSlices name the holder's
// pod alone, before and after the rollout.
// The same manifest with the readiness probe on /v1/health/leader alone
// (200 for the leader only) never becomes available: rollout status times
// out.
func TestRolloutCompletes(t *testing.T) {
	k := testserver.SharedKubeAPIServer(t)
	testserver.StartKubeControllers(t, k, "deployment-controller", "replicaset-controller", "endpointslice-controller")
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
			kc("apply", "--server-side", "-f", filepath.Join("base", "service.yaml"))
			kubeconfig := serviceAccountKubeconfig(ctx, t, k, admin, t.TempDir())
			api := newAPIClient(t, k)
			selector := serviceSelector(t)
			watch := api.watchSelector(t, ns, selector)

			var md deployment
			if err := yaml.Unmarshal([]byte(tc.manifest), &md); err != nil {
				t.Fatal(err)
			}
			// A Node for the pods: the EndpointSlice controller lists only
			// pods on a node it knows.
			node := ns + "-node"
			if err := api.do(ctx, http.MethodPost, "/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": node}}, nil); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = api.do(context.Background(), http.MethodDelete, "/api/v1/nodes/"+node, nil, nil) })
			kl := &kubelet{t: t, api: api, ns: ns, bin: bin, kubeconfig: kubeconfig, c: batonContainer(md), node: node,
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
			testkit.Eventually(t, time.Minute, "the leader Service's EndpointSlices to name the holder's pod alone", func() bool {
				return slices.Equal(api.endpoints(ctx, ns, "my-service-leader"), []string{holder})
			})

			// Through the rollout, every 10 ms: the Lease's holder and the
			// leader Service's ready endpoints. Each time the holder changes,
			// how long until the endpoints name it alone; and whether they
			// ever named two pods.
			var (
				mu     sync.Mutex // guards lags and two
				lags   []time.Duration
				two    []string
				mctx   context.Context
				mstop  context.CancelFunc
				mdone  = make(chan struct{})
				follow = holder
			)
			mctx, mstop = context.WithCancel(ctx)
			go func() {
				defer close(mdone)
				var changed time.Time
				for mctx.Err() == nil {
					h := api.leaseHolder(mctx, ns, "my-service")
					eps := api.endpoints(mctx, ns, "my-service-leader")
					mu.Lock()
					if len(eps) > 1 && two == nil {
						two = eps
					}
					if h != "" && h != follow {
						follow, changed = h, time.Now()
					}
					if !changed.IsZero() && slices.Equal(eps, []string{follow}) {
						lags = append(lags, time.Since(changed))
						changed = time.Time{}
					}
					mu.Unlock()
					time.Sleep(testkit.PollInterval)
				}
			}()
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
			testkit.Eventually(t, time.Minute, "a new pod to hold the lease, and the selector and the EndpointSlices to name it alone", func() bool {
				next = api.leaseHolder(ctx, ns, "my-service")
				got, err := api.selected(ctx, ns, selector)
				return err == nil && slices.Contains(now, next) && slices.Equal(got, []string{next}) &&
					slices.Equal(api.endpoints(ctx, ns, "my-service-leader"), []string{next})
			})
			// The monitor polls on its own schedule: the state just seen
			// above reaches it at its next poll or two.
			testkit.Eventually(t, time.Minute, "the monitor to see the new holder named alone", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(lags) > 0 && follow == next
			})
			mstop()
			<-mdone
			if most := watch.mostAtOnce(); len(most) > 1 {
				t.Errorf("the leader Service's selector picked %v at once", most)
			}
			if two != nil {
				t.Errorf("the leader Service's EndpointSlices named %v as ready at once", two)
			}
			if len(lags) == 0 {
				t.Error("the lease changed hands in the rollout, but the EndpointSlices were never seen naming the new holder alone")
			}
			t.Logf("the leader Service's EndpointSlices named the new holder alone %v after the Lease named it (polled every %s)", lags, testkit.PollInterval)
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
