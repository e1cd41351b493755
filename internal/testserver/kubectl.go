package testserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// KubectlTool is the kubectl the tests run against a KubeAPIServer, built
// from the same pinned k8s.io/kubernetes in tools/kubernetes as
// KubeAPIServerTool, so that client and server are one release.
var KubectlTool = Tool{
	Name:    "kubectl",
	Module:  "k8s.io/kubernetes",
	Version: "v1.37.2",
	Package: "k8s.io/kubernetes/cmd/kubectl",
	Dir:     "tools/kubernetes",
}

func init() {
	hints["kubectl"] = "testserver.NewKubectl runs kubectl built once from tools/kubernetes " +
		"(`go run ./internal/testserver/buildtools` does it up front) " +
		"into $XDG_CACHE_HOME/baton-tools/kubectl-v1.37.2 (~/.cache when unset)"
}

// Kubectl runs kubectl against one KubeAPIServer as one of its users,
// with a kubeconfig of its own and nothing from the developer's
// environment: no ~/.kube, no KUBECONFIG, so that a test can never reach
// another cluster. Safe for concurrent use.
type Kubectl struct {
	bin  string
	dir  string // HOME, the kubeconfig and kubectl's cache
	conf string
}

// NewKubectl returns a Kubectl that reaches k as user (KubeAdminUser or
// KubeUser), in namespace when not empty (else "default"). A kubectl that
// cannot be built goes through Unavailable.
func NewKubectl(t testing.TB, k *KubeAPIServer, user, namespace string) *Kubectl {
	t.Helper()
	bin, err := KubectlTool.Binary()
	if err != nil {
		Unavailable(t, "kubectl", fmt.Errorf("%w\n%s", err, KubectlTool.Hint()))
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(conf, k.Kubeconfig(k.Host(), user, namespace), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Kubectl{bin: bin, dir: dir, conf: conf}
}

// Kubeconfig returns the path of the kubeconfig it runs with.
func (c *Kubectl) Kubeconfig() string { return c.conf }

// Run runs kubectl with args and stdin (nil: none) until it exits or ctx
// ends, and returns its stdout and stderr. err is a *KubectlError when
// kubectl ran and exited with a status other than 0.
func (c *Kubectl) Run(ctx context.Context, stdin io.Reader, args ...string) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, c.bin, append([]string{"--kubeconfig=" + c.conf}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + c.dir, "KUBECACHEDIR=" + filepath.Join(c.dir, "cache")}
	cmd.Stdin = stdin
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = &KubectlError{Args: args, Status: ee.ExitCode(), Stderr: errOut.String()}
	}
	return out.String(), errOut.String(), err
}

// KubectlError reports a kubectl that exited with a status other than 0.
type KubectlError struct {
	Args   []string
	Status int
	Stderr string
}

// Error implements error. A --token argument shows as --token=REDACTED.
func (e *KubectlError) Error() string {
	args := make([]string, len(e.Args))
	for i, a := range e.Args {
		if strings.HasPrefix(a, "--token=") {
			a = "--token=REDACTED"
		}
		args[i] = a
	}
	return fmt.Sprintf("kubectl %s: exit status %d: %s", strings.Join(args, " "), e.Status, strings.TrimSpace(e.Stderr))
}
