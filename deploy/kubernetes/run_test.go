package kubernetes

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestDeploymentRunsBaton runs the command line of each variant's baton
// container, as the kubelet would start it in three pods, with a real baton
// against a real kube-apiserver, as the manifests' ServiceAccount (its own
// token, granted by base/rbac.yaml and nothing else), each beside a Pod
// object of its name (no kubelet runs them: only their labels matter). What
// differs from a pod: the credentials come from a kubeconfig holding that
// token instead of the mounted service account, and --http listens on
// loopback (tests bind nothing else). In run/, the program after -- is a
// stand-in that ignores SIGTERM, so that stopping it takes the whole
// --grace. In sidecar/, the command after -- is the manifest's own, run
// as in the release image the sidecar names: with a PATH that holds baton
// and nothing else (no shell, no sleep). It checks what
// docs/kubernetes.md says of the Deployments: the first pod leads (200 on
// /v1/health/leader, its pod name the Lease's holder), the others stand by
// (429); the readiness probe's path answers 200 in all three, so all would
// be Ready; the leader Service's selector picks the holder's pod alone (a
// watch of the pods checks that it never picks two); and a SIGTERM to the
// holder, as the kubelet sends at a rollout or a scale-down, hands over
// without waiting out the lease duration, moves the label to the new
// holder, and ends baton, with status 0, within the pod's
// terminationGracePeriodSeconds.
func TestDeploymentRunsBaton(t *testing.T) {
	k := testserver.SharedKubeAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := buildBaton(ctx, t)
	deployments := map[string]manifest{}
	for _, m := range loadManifests(t) {
		if m.kind() == "Deployment" {
			deployments[filepath.Dir(m.file)] = m
		}
	}
	for _, v := range variants {
		t.Run(v, func(t *testing.T) {
			m, ok := deployments[v]
			if !ok {
				t.Fatalf("no Deployment in %s/", v)
			}
			var d deployment
			m.decode(t, &d)
			c := batonContainer(d)
			flags := batonFlags(t, m, c)
			ttl, err := time.ParseDuration(flags["ttl"])
			if err != nil {
				t.Fatal(err)
			}
			tgp := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
			program := c.Args[slices.Index(c.Args, "--")+1:]
			// The release image: baton alone on the PATH.
			path := filepath.Dir(bin)
			if v == "run" {
				// The program's own image, with a shell.
				program = []string{"sh", "-c", `trap "" TERM; sleep 1000`}
				path = os.Getenv("PATH")
			}
			runPods(ctx, t, k, bin, path, testkit.Unique("deploy-"+v), c, d.Spec.Template.Metadata.Labels, flags["lease"], program, ttl, tgp)
		})
	}
}

// buildBaton builds the baton binary into a temporary directory of its
// own, named baton, so that the directory alone on a PATH is the release
// image's (/usr/local/bin/baton and nothing else).
func buildBaton(ctx context.Context, t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "baton")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/batonhq/baton/cmd/baton").CombinedOutput(); err != nil {
		t.Fatalf("build baton: %v\n%s", err, out)
	}
	return bin
}

// batonContainer returns the container of d that runs baton.
func batonContainer(d deployment) container {
	var c container
	for _, cc := range append(append([]container(nil), d.Spec.Template.Spec.InitContainers...), d.Spec.Template.Spec.Containers...) {
		if slices.Equal(cc.Command, []string{"baton"}) {
			c = cc
		}
	}
	return c
}

// fakePod is a Pod object and the baton its container would run.
type fakePod struct {
	name   string
	http   string // baton's --http address
	cmd    *exec.Cmd
	out    *testserver.SyncBuffer
	exited chan struct{}
}

// startBaton runs c's baton command line as the kubelet would expand it
// for pod name in ns (POD_NAME and POD_NAMESPACE set, --http on a loopback
// port), with program after --, as the ServiceAccount of kubeconfig, with
// path as the container's PATH.
func startBaton(t *testing.T, bin, path, kubeconfig, ns, name string, c container, program []string) *fakePod {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var args []string
	for _, a := range c.Args[:slices.Index(c.Args, "--")] {
		a = strings.NewReplacer("$(POD_NAME)", name, "$(POD_NAMESPACE)", ns).Replace(a)
		if strings.HasPrefix(a, "--http=") {
			a = "--http=" + addr
		}
		args = append(args, a)
	}
	args = append(append(args, "--"), program...)
	p := &fakePod{name: name, http: "http://" + addr, out: new(testserver.SyncBuffer), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = []string{"PATH=" + path, "HOME=" + filepath.Dir(kubeconfig), "KUBECONFIG=" + kubeconfig,
		"POD_NAME=" + name, "POD_NAMESPACE=" + ns}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("%s (baton %s):\n%s", name, strings.Join(args, " "), p.out)
		}
	})
	return p
}

var probeClient = &http.Client{Timeout: 5 * time.Second}

// get returns the status of GET path on p's baton, 0 if it does not
// answer; it fails the test if baton has exited.
func (p *fakePod) get(t *testing.T, path string) int {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("baton of %s exited (%v):\n%s", p.name, p.cmd.ProcessState, p.out)
	default:
	}
	resp, err := probeClient.Get(p.http + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// leaseHolder returns the holderIdentity of Lease lease in ns, "" if none.
func (c *apiClient) leaseHolder(ctx context.Context, ns, lease string) string {
	var l struct {
		Spec struct {
			HolderIdentity string `json:"holderIdentity"`
		} `json:"spec"`
	}
	if err := c.do(ctx, http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases/"+lease, nil, &l); err != nil {
		return ""
	}
	return l.Spec.HolderIdentity
}

// runPods runs c's baton command line in three pods' stead in namespace
// ns, with program after -- and path as the PATH, and checks the leader, the standbys, the
// leader Service's selector and the hand-over on SIGTERM
// (TestDeploymentRunsBaton).
func runPods(ctx context.Context, t *testing.T, k *testserver.KubeAPIServer, bin, path, ns string, c container, labels map[string]string, lease string, program []string, ttl, tgp time.Duration) {
	admin := testserver.NewKubectl(t, k, testserver.KubeAdminUser, ns)
	for _, args := range [][]string{
		{"create", "namespace", ns},
		{"apply", "--server-side", "-f", filepath.Join("base", "rbac.yaml")},
	} {
		if _, _, err := admin.Run(ctx, nil, args...); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := serviceAccountKubeconfig(ctx, t, k, admin, t.TempDir())
	api := newAPIClient(t, k)
	readiness := c.ReadinessProbe.HTTPGet.Path
	leader, _, _ := strings.Cut(readiness, "?")
	selector := serviceSelector(t)
	watch := api.watchSelector(t, ns, selector)
	start := func(name string) *fakePod {
		t.Helper()
		if err := api.createPod(ctx, ns, name, labels); err != nil {
			t.Fatal(err)
		}
		return startBaton(t, bin, path, kubeconfig, ns, name, c, program)
	}
	picked := func() []string {
		got, err := api.selected(ctx, ns, selector)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	a := start("my-service-a")
	testkit.Eventually(t, time.Minute, "the first pod to lead (200 on "+leader+")", func() bool { return a.get(t, leader) == http.StatusOK })
	if h := api.leaseHolder(ctx, ns, lease); h != a.name {
		t.Fatalf("the Lease's holder is %q, want the pod name %q", h, a.name)
	}
	pods := []*fakePod{a, start("my-service-b"), start("my-service-c")}
	for _, p := range pods[1:] {
		testkit.Eventually(t, time.Minute, p.name+" to stand by (429 on "+leader+")", func() bool { return p.get(t, leader) == http.StatusTooManyRequests })
	}
	// Ready: the readiness probe's path answers 2xx in every pod, the
	// leader's and the standbys'.
	for _, p := range pods {
		if got := p.get(t, readiness); got != http.StatusOK {
			t.Errorf("%s: the readiness probe %s answers %d, want 200: the pod would not be Ready", p.name, readiness, got)
		}
	}
	testkit.Eventually(t, time.Minute, "the leader Service's selector to pick the holder's pod alone", func() bool {
		return slices.Equal(picked(), []string{a.name})
	})

	// The kubelet's SIGTERM to the leader's pod.
	stopped := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var next *fakePod
	testkit.Eventually(t, ttl, "a standby to lead within a lease duration of the SIGTERM (a released Lease, not an expired one)", func() bool {
		for _, p := range pods[1:] {
			if p.get(t, leader) == http.StatusOK {
				next = p
				return true
			}
		}
		return false
	})
	led := time.Now()
	testkit.Eventually(t, time.Minute, "the leader Service's selector to pick the new holder alone", func() bool {
		return slices.Equal(picked(), []string{next.name})
	})
	t.Logf("hand-over %s -> %s: the new holder led %s after the SIGTERM; the selector picked it alone %s after that (polled every %s)",
		a.name, next.name, led.Sub(stopped).Round(time.Millisecond), time.Since(led).Round(time.Millisecond), testkit.PollInterval)
	select {
	case <-a.exited:
	case <-time.After(tgp - time.Since(stopped)):
		t.Fatalf("baton still running %s after SIGTERM, the pod's terminationGracePeriodSeconds", tgp)
	}
	if code := a.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("baton exited %d on SIGTERM, want 0", code)
	}
	if h := api.leaseHolder(ctx, ns, lease); h != next.name {
		t.Errorf("after the hand-over the Lease's holder is %q, want %q", h, next.name)
	}
	for _, p := range pods[1:] {
		if got := p.get(t, readiness); got != http.StatusOK {
			t.Errorf("%s after the hand-over: the readiness probe answers %d, want 200", p.name, got)
		}
	}
	if most := watch.mostAtOnce(); len(most) > 1 {
		t.Errorf("the leader Service's selector picked %v at once", most)
	}
}
