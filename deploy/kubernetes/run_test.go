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

// TestDeploymentRunsBaton runs the command line of run/deployment.yaml's
// container, as the kubelet would start it in two pods, with a real baton
// against a real kube-apiserver, as the manifests' ServiceAccount (its own
// token, granted by base/rbac.yaml and nothing else). What differs from a
// pod: the credentials come from a kubeconfig holding that token instead
// of the mounted service account, --http listens on loopback (tests bind
// nothing else), and the program after -- is a stand-in that ignores
// SIGTERM. It checks what
// docs/kubernetes.md says of a Deployment: the first pod leads (200 on the
// readiness probe's path, its pod name the Lease's holder), the second
// stands by (429), and a SIGTERM, as the kubelet sends at a rollout or a
// scale-down, hands over without waiting out the lease duration and ends
// baton within the pod's terminationGracePeriodSeconds, although the
// program has to be killed after --grace.
func TestDeploymentRunsBaton(t *testing.T) {
	var d deployment
	var m manifest
	for _, mm := range loadManifests(t) {
		if mm.kind() == "Deployment" && mm.file == filepath.Join("run", "deployment.yaml") {
			m = mm
			mm.decode(t, &d)
		}
	}
	if m.file == "" {
		t.Fatal("no Deployment in run/deployment.yaml")
	}
	c := d.Spec.Template.Spec.Containers[0]
	flags := batonFlags(t, m, c)
	ttl, err := time.ParseDuration(flags["ttl"])
	if err != nil {
		t.Fatal(err)
	}
	tgp := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	probe := c.ReadinessProbe.HTTPGet.Path

	k := testserver.StartKubeAPIServer(t)
	admin := testserver.NewKubectl(t, k, testserver.KubeAdminUser, namespace)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"create", "namespace", namespace},
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

	bin := filepath.Join(dir, "baton")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/batonhq/baton/cmd/baton").CombinedOutput(); err != nil {
		t.Fatalf("build baton: %v\n%s", err, out)
	}

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
		// loopback, and after -- a stand-in for the program that ignores
		// SIGTERM, so that stopping it takes the whole --grace: the
		// longest a term's end can take.
		var args []string
		for _, a := range c.Args[:slices.Index(c.Args, "--")] {
			a = strings.NewReplacer("$(POD_NAME)", name, "$(POD_NAMESPACE)", namespace).Replace(a)
			if strings.HasPrefix(a, "--http=") {
				a = "--http=" + addr
			}
			args = append(args, a)
		}
		args = append(args, "--", "sh", "-c", `trap "" TERM; sleep 1000`)
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
		out, _, err := admin.Run(ctx, nil, "get", "lease", flags["lease"], "-o", "jsonpath={.spec.holderIdentity}")
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
