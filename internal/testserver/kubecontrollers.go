package testserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// KubeControllerManagerTool is the kube-controller-manager the tests run
// beside a KubeAPIServer, built from the same pinned k8s.io/kubernetes in
// tools/kubernetes, so that the Deployment and ReplicaSet controllers act on
// the test's objects as a cluster's would.
var KubeControllerManagerTool = Tool{
	Name:    "kube-controller-manager",
	Module:  "k8s.io/kubernetes",
	Version: "v1.37.2",
	Package: "k8s.io/kubernetes/cmd/kube-controller-manager",
	Dir:     "tools/kubernetes",
}

func init() {
	hints["kube-controller-manager"] = "testserver.StartKubeControllers runs kube-controller-manager built once from tools/kubernetes " +
		"(a cold build takes minutes; `go run ./internal/testserver/buildtools` does it up front) " +
		"into $XDG_CACHE_HOME/baton-tools/kube-controller-manager-v1.37.2 (~/.cache when unset)"
}

// StartKubeControllers runs kube-controller-manager against k, as
// KubeAdminUser, with only the named controllers (as its --controllers
// takes them, e.g. "deployment-controller"), no leader election and no
// serving port, until the test ends. Its output is shown only if the test
// fails. No kubelet or scheduler runs: the pods the controllers create
// stay Pending, unscheduled, until the test changes their status itself.
// A binary that cannot be built goes through Unavailable.
func StartKubeControllers(t testing.TB, k *KubeAPIServer, controllers ...string) {
	t.Helper()
	bin, err := KubeControllerManagerTool.Binary()
	if err != nil {
		Unavailable(t, "kube-controller-manager", fmt.Errorf("%w\n%s", err, KubeControllerManagerTool.Hint()))
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(conf, k.Kubeconfig(k.Host(), KubeAdminUser, ""), 0o600); err != nil {
		t.Fatal(err)
	}
	out := new(SyncBuffer)
	cmd := exec.Command(bin,
		"--kubeconfig="+conf,
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		// No HTTPS endpoint (metrics, health): nothing reads it, and it
		// would need a port and authentication of its own.
		"--secure-port=0",
		"--v=1",
	)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kube-controller-manager: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(kubeStopTimeout):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("kube-controller-manager log:\n%s", out)
		}
	})
}
