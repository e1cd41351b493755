package kubernetes

import (
	"context"
	"encoding/base64"
	"fmt"
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
// container, as the kubelet would start it in two pods, with a real baton
// against a real kube-apiserver, as the manifests' ServiceAccount (its own
// token, granted by base/rbac.yaml and nothing else). What differs from a
// pod: the credentials come from a kubeconfig holding that token instead
// of the mounted service account, and --http listens on loopback (tests
// bind nothing else). In run/, the program after -- is a stand-in that
// ignores SIGTERM, so that stopping it takes the whole --grace; the
// sidecar's placeholder is its own. It checks what docs/kubernetes.md says
// of the Deployments: the first pod leads (200 on the readiness probe's
// path, its pod name the Lease's holder), the second stands by (429), and a
// SIGTERM, as the kubelet sends at a rollout or a scale-down, hands over
// without waiting out the lease duration and ends baton, with status 0,
// within the pod's terminationGracePeriodSeconds.
func TestDeploymentRunsBaton(t *testing.T) {
	k := testserver.SharedKubeAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "baton")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/batonhq/baton/cmd/baton").CombinedOutput(); err != nil {
		t.Fatalf("build baton: %v\n%s", err, out)
	}
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
			var c container
			for _, cc := range append(append([]container(nil), d.Spec.Template.Spec.InitContainers...), d.Spec.Template.Spec.Containers...) {
				if slices.Equal(cc.Command, []string{"baton"}) {
					c = cc
				}
			}
			flags := batonFlags(t, m, c)
			ttl, err := time.ParseDuration(flags["ttl"])
			if err != nil {
				t.Fatal(err)
			}
			tgp := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
			program := c.Args[slices.Index(c.Args, "--")+1:]
			if v == "run" {
				program = []string{"sh", "-c", `trap "" TERM; sleep 1000`}
			}
			runPods(ctx, t, k, bin, testkit.Unique("deploy-"+v), c, flags["lease"], program, ttl, tgp)
		})
	}
}

// runPods runs c's baton command line in two pods' stead in namespace ns,
// with program after --, and checks the leader, the standby and the
// hand-over on SIGTERM (TestDeploymentRunsBaton).
func runPods(ctx context.Context, t *testing.T, k *testserver.KubeAPIServer, bin, ns string, c container, lease string, program []string, ttl, tgp time.Duration) {
	admin := testserver.NewKubectl(t, k, testserver.KubeAdminUser, ns)
	for _, args := range [][]string{
		{"create", "namespace", ns},
		{"apply", "--server-side", "-f", filepath.Join("base", "rbac.yaml")},
	} {
		if _, _, err := admin.Run(ctx, nil, args...); err != nil {
			t.Fatal(err)
		}
	}
	token, _, err := admin.Run(ctx, nil, "create", "token", "my-service", "--duration=1h")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
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
	probe := c.ReadinessProbe.HTTPGet.Path

	type pod struct {
		name   string
		health string
		cmd    *exec.Cmd
		out    *testserver.SyncBuffer
		exited chan struct{}
	}
	start := func(name string) *pod {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		// The container's args as the kubelet expands them, --http on
		// loopback, and program after --.
		var args []string
		for _, a := range c.Args[:slices.Index(c.Args, "--")] {
			a = strings.NewReplacer("$(POD_NAME)", name, "$(POD_NAMESPACE)", ns).Replace(a)
			if strings.HasPrefix(a, "--http=") {
				a = "--http=" + addr
			}
			args = append(args, a)
		}
		args = append(append(args, "--"), program...)
		p := &pod{name: name, health: "http://" + addr + probe, out: new(testserver.SyncBuffer), exited: make(chan struct{})}
		p.cmd = exec.Command(bin, args...)
		p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "KUBECONFIG=" + kubeconfig}
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
	hc := &http.Client{Timeout: 2 * time.Second}
	status := func(p *pod) int {
		select {
		case <-p.exited:
			t.Fatalf("baton of %s exited (%v):\n%s", p.name, p.cmd.ProcessState, p.out)
		default:
		}
		resp, err := hc.Get(p.health)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	holder := func() string {
		out, _, err := admin.Run(ctx, nil, "get", "lease", lease, "-o", "jsonpath={.spec.holderIdentity}")
		if err != nil {
			return ""
		}
		return out
	}

	a := start("my-service-a")
	testkit.Eventually(t, time.Minute, "the first pod to lead (200 on "+probe+")", func() bool { return status(a) == http.StatusOK })
	if h := holder(); h != a.name {
		t.Fatalf("the Lease's holder is %q, want the pod name %q", h, a.name)
	}
	b := start("my-service-b")
	testkit.Eventually(t, time.Minute, "the second pod to stand by (429)", func() bool { return status(b) == http.StatusTooManyRequests })
	if got := status(a); got != http.StatusOK {
		t.Fatalf("the leader answers %d beside a standby", got)
	}

	// The kubelet's SIGTERM to the leader's pod.
	stopped := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, ttl, "the standby to lead within a lease duration of the SIGTERM (a released Lease, not an expired one)",
		func() bool { return status(b) == http.StatusOK })
	select {
	case <-a.exited:
	case <-time.After(tgp - time.Since(stopped)):
		t.Fatalf("baton still running %s after SIGTERM, the pod's terminationGracePeriodSeconds", tgp)
	}
	if code := a.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("baton exited %d on SIGTERM, want 0", code)
	}
	if h := holder(); h != b.name {
		t.Errorf("after the hand-over the Lease's holder is %q, want %q", h, b.name)
	}
}
