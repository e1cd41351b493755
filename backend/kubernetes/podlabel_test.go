package kubernetes_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// podLabelRules are what a LeaderLabel needs beside the Leases.
var podLabelRules = []rbacv1.PolicyRule{{
	APIGroups: []string{""},
	Resources: []string{"pods"},
	Verbs:     []string{"list", "patch"},
}}

const leaderKey, leaderValue = "baton.io/leader", "work"

// labelled returns the names of the pods of ns that the leader Service's
// selector picks, sorted.
func labelled(ctx context.Context, t *testing.T, cs k8s.Interface, ns string) []string {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: leaderKey + "=" + leaderValue})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// createPods makes the Pod objects (no kubelet runs them: only their
// labels matter here), and the ServiceAccount that admission wants.
func createPods(ctx context.Context, t *testing.T, admin k8s.Interface, ns string, labels map[string]map[string]string, names ...string) {
	t.Helper()
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		lb := map[string]string{"app.kubernetes.io/name": "work"}
		for k, v := range labels[n] {
			lb[k] = v
		}
		_, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: n, Labels: lb},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example.com/work:1"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestLeaderLabelFollowsTheHolder runs three candidates on real Leases,
// each with a LeaderLabel on its own Pod object, as a user granted only
// the Leases and list/patch on pods. A fourth pod starts with the label (a
// holder that crashed and left it). Throughout, a watch of the pods
// checks that the leader Service's selector never picks two pods; once a
// candidate leads, it picks exactly the Lease's holder; after each
// hand-over (the holder's Run cancelled: a release), exactly the new one.
// Last, a candidate whose pod kept the label of its previous run (a
// restarted container) removes it before it is ever elected.
func TestLeaderLabelFollowsTheHolder(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	ns := testkit.Unique("baton-podlabel")
	if err := srv.Grant(testkit.Context(t, 30*time.Second), ns, testserver.KubeUser, append(slices.Clone(leaseRules), podLabelRules...)); err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 3*time.Minute)
	// The test's own polls are not rate-limited as a client's are (5
	// requests a second), so that they see a change when it happens.
	adminConfig := restConfig(srv, srv.Host(), testserver.KubeAdminUser)
	adminConfig.QPS, adminConfig.Burst = 1000, 1000
	admin, err := k8s.NewForConfig(adminConfig)
	if err != nil {
		t.Fatal(err)
	}
	stale := map[string]string{leaderKey: leaderValue}
	createPods(ctx, t, admin, ns, map[string]map[string]string{"crashed": stale}, "crashed", "pod-0", "pod-1", "pod-2")

	// The selector's picks, from a watch of every pod: never two.
	w, err := admin.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		picked  = map[string]bool{}
		twoSeen []string
	)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			mu.Lock()
			picked[p.Name] = ev.Type != watch.Deleted && p.Labels[leaderKey] == leaderValue
			var now []string
			for n, on := range picked {
				if on {
					now = append(now, n)
				}
			}
			if len(now) > 1 && twoSeen == nil {
				slices.Sort(now)
				twoSeen = now
			}
			mu.Unlock()
		}
	}()
	defer func() { w.Stop(); <-watched }()

	user := restConfig(srv, srv.Host(), testserver.KubeUser)
	cs, err := k8s.NewForConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	type candidate struct {
		name   string
		cancel context.CancelFunc
		done   chan struct{}
	}
	// Each candidate has a client of its own, as each pod's process does
	// (client-go limits each client to 5 requests a second).
	start := func(name string) *candidate {
		cs, err := k8s.NewForConfig(user)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kubernetes.New(cs, kubernetes.Options{Namespace: ns, RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: 10 * time.Second}}})
		if err != nil {
			t.Fatal(err)
		}
		l, err := kubernetes.NewLeaderLabel(cs.CoreV1(), kubernetes.LeaderLabelOptions{Namespace: ns, Pod: name, Key: leaderKey, Value: leaderValue, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		cfg := baton.ElectorConfig{Lease: "work", Candidate: baton.Candidate{ID: name}}
		l.Hooks(&cfg)
		e, err := baton.NewElector(b, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		c := &candidate{name: name, cancel: cancel, done: make(chan struct{})}
		var wg sync.WaitGroup
		wg.Go(func() { _ = l.Run(cctx) })
		wg.Go(func() {
			_ = e.Run(cctx, func(ctx context.Context, _ baton.Term) error { <-ctx.Done(); return nil })
		})
		go func() {
			wg.Wait()
			_ = b.Close(context.Background())
			close(c.done)
		}()
		return c
	}
	holder := func() string {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, "work", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	// waitPicked waits until the selector picks the Lease's holder alone,
	// other than old, and returns it, with how long after the Lease first
	// named it (as this test's polls saw it) the selector picked it.
	waitPicked := func(why, old string) (string, time.Duration) {
		t.Helper()
		var (
			h     string
			named time.Time
		)
		testkit.Eventually(t, 30*time.Second, why, func() bool {
			if cur := holder(); cur != h {
				h, named = cur, time.Now()
			}
			got := labelled(ctx, t, admin, ns)
			return h != "" && h != old && slices.Equal(got, []string{h})
		})
		return h, time.Since(named)
	}

	cands := map[string]*candidate{}
	for _, n := range []string{"pod-0", "pod-1", "pod-2"} {
		cands[n] = start(n)
	}
	h, _ := waitPicked("the selector picks the first holder alone; the crashed pod's stale label is gone", "")
	for range 2 {
		began := time.Now()
		old := cands[h]
		old.cancel()
		<-old.done
		delete(cands, h)
		next, lag := waitPicked("the selector picks the new holder alone after "+h+" handed over", h)
		t.Logf("hand-over %s -> %s: the selector picked the new holder alone %s after the old one began to stop, %s after the Lease named it",
			h, next, time.Since(began).Round(time.Millisecond), lag.Round(time.Millisecond))
		h = next
	}
	for _, c := range cands {
		c.cancel()
		<-c.done
	}
	if got := labelled(ctx, t, admin, ns); len(got) != 0 {
		t.Errorf("after every candidate stopped, still labelled: %v", got)
	}

	// A container restarted in a pod that kept its label: a LeaderLabel
	// that has not been elected removes it at start.
	if _, err := admin.CoreV1().Pods(ns).Patch(ctx, "pod-1", types.MergePatchType, []byte(`{"metadata":{"labels":{"`+leaderKey+`":"`+leaderValue+`"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := kubernetes.NewLeaderLabel(cs.CoreV1(), kubernetes.LeaderLabelOptions{Namespace: ns, Pod: "pod-1", Key: leaderKey, Value: leaderValue})
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = l.Run(lctx) }()
	testkit.Eventually(t, 30*time.Second, "a restarted candidate removes its pod's old label", func() bool { return len(labelled(ctx, t, admin, ns)) == 0 })
	lcancel()
	<-ran
	mu.Lock()
	defer mu.Unlock()
	if twoSeen != nil {
		t.Errorf("the leader selector picked two pods at once: %v", twoSeen)
	}
}

// testWriter sends a logger's lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
