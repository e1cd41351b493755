package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// deploymentStatus is the part of a Deployment's status the rollout test
// reads.
type deploymentStatus struct {
	Metadata struct {
		Generation int64 `json:"generation"`
	} `json:"metadata"`
	Status struct {
		ObservedGeneration int64 `json:"observedGeneration"`
		Replicas           int32 `json:"replicas"`
		UpdatedReplicas    int32 `json:"updatedReplicas"`
		AvailableReplicas  int32 `json:"availableReplicas"`
		Conditions         []struct {
			Type, Status, Reason string
		} `json:"conditions"`
	} `json:"status"`
}

// TestRolloutReplacesTheLeader runs the Deployment and ReplicaSet
// controllers of a real kube-controller-manager on run/deployment.yaml,
// with one of its pods Ready (the leader: no kubelet runs, so the test sets
// the pods' status as a kubelet would from the readiness probe), and rolls
// it out again. With the manifest's strategy the rollout replaces every
// pod, the leader included. With the default strategy (25% unavailable,
// 25% surge), the controller waits for a new pod to become available before
// it stops the old leader, and no new pod can become available while the
// old leader holds the lease: the rollout never finishes, which the
// controller itself reports once the progress deadline has passed.
func TestRolloutReplacesTheLeader(t *testing.T) {
	k := testserver.SharedKubeAPIServer(t)
	testserver.StartKubeControllers(t, k, "deployment-controller", "replicaset-controller")
	admin := testserver.NewKubectl(t, k, testserver.KubeAdminUser, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	data, err := os.ReadFile(filepath.Join("run", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	manifest := string(data)
	// The default strategy: the manifest without its strategy block.
	from, to := strings.Index(manifest, "  strategy:\n"), strings.Index(manifest, "  progressDeadlineSeconds: 2147483647\n")
	if from < 0 || to < from {
		t.Fatal("run/deployment.yaml: no strategy block followed by progressDeadlineSeconds: 2147483647")
	}
	defaults := manifest[:from] + manifest[to:]

	for _, c := range []struct {
		name, ns, manifest string
		replaced           bool
	}{
		{"manifest", testkit.Unique("rollout-manifest"), manifest, true},
		{"default strategy", testkit.Unique("rollout-default"), defaults, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			kc := func(args ...string) string {
				t.Helper()
				out, _, err := admin.Run(ctx, nil, append([]string{"-n", c.ns}, args...)...)
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			kc("create", "namespace", c.ns)
			// The ServiceAccount first: the server refuses pods that name a
			// missing one.
			kc("apply", "--server-side", "-f", filepath.Join("base", "rbac.yaml"))
			if _, _, err := admin.Run(ctx, strings.NewReader(c.manifest), "-n", c.ns, "apply", "--server-side", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			status := func() deploymentStatus {
				t.Helper()
				var d deploymentStatus
				if err := json.Unmarshal([]byte(kc("get", "deployment", "my-service", "-o", "json")), &d); err != nil {
					t.Fatal(err)
				}
				return d
			}
			pods := func() []string {
				t.Helper()
				return strings.Fields(kc("get", "pods", "-l", "app.kubernetes.io/name=my-service", "-o", "jsonpath={.items[*].metadata.name}"))
			}
			poll := func(what string, cond func() bool) {
				t.Helper()
				if !testkit.Poll(2*time.Minute, 200*time.Millisecond, cond) {
					t.Fatalf("timed out waiting for %s; deployment status: %+v; pods: %v", what, status().Status, pods())
				}
			}

			var first []string
			poll("the ReplicaSet's two pods", func() bool { first = pods(); return len(first) == 2 })
			// The leader's readiness probe passes; the standby's fails.
			leader := first[0]
			kc("patch", "pod", leader, "--subresource=status", "--type=merge", "-p",
				`{"status":{"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"`+time.Now().UTC().Format(time.RFC3339)+`"}]}}`)
			poll("the leader to be the one available replica", func() bool { return status().Status.AvailableReplicas == 1 })

			// The rollout: a change to the pod template, as `kubectl rollout
			// restart` makes. With the default strategy, a progress
			// deadline short enough to watch it pass comes with it; before
			// this there was none, so any verdict on progress is about
			// this rollout.
			spec := `"template":{"metadata":{"annotations":{"rollout":"2"}}}`
			if !c.replaced {
				spec += `,"progressDeadlineSeconds":5`
			}
			kc("patch", "deployment", "my-service", "--type=merge", "-p", `{"spec":{`+spec+`}}`)
			leaderGone := func() bool {
				_, stderr, err := admin.Run(ctx, nil, "-n", c.ns, "get", "pod", leader)
				var ke *testserver.KubectlError
				return errors.As(err, &ke) && strings.Contains(stderr, "NotFound")
			}
			if c.replaced {
				poll("every pod replaced, the leader's too", func() bool {
					s := status()
					return s.Status.ObservedGeneration == s.Metadata.Generation &&
						s.Status.UpdatedReplicas == 2 && s.Status.Replicas == 2 && leaderGone()
				})
				return
			}
			// 25% of two pods: one surge pod, none unavailable. The
			// controller makes one new pod, then keeps both old ones,
			// leader and standby, waiting for the new one to be available.
			poll("the rollout to stop at one new pod beside the two old ones", func() bool {
				s := status()
				return s.Status.ObservedGeneration == s.Metadata.Generation && s.Status.UpdatedReplicas == 1 && s.Status.Replicas == 3
			})
			poll("the controller to report the rollout stuck", func() bool {
				for _, cond := range status().Status.Conditions {
					if cond.Type == "Progressing" && cond.Status == "False" && cond.Reason == "ProgressDeadlineExceeded" {
						return true
					}
				}
				return false
			})
			if leaderGone() {
				t.Fatal("the old leader's pod was replaced under the default strategy")
			}
			if s := status(); s.Status.UpdatedReplicas != 1 || s.Status.Replicas != 3 {
				t.Fatalf("the stuck rollout moved on: %+v", s.Status)
			}
		})
	}
}
