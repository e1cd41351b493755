package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/certs"
)

// KubeAPIServerTool is the kube-apiserver the tests run, built from the
// pinned k8s.io/kubernetes in tools/kubernetes, the release whose staging
// modules (k8s.io/client-go v0.37.2 and its siblings) the Kubernetes
// backend is built against.
var KubeAPIServerTool = Tool{
	Name:    "kube-apiserver",
	Module:  "k8s.io/kubernetes",
	Version: "v1.37.2",
	Package: "k8s.io/kubernetes/cmd/kube-apiserver",
	Dir:     "tools/kubernetes",
}

// The users of a KubeAPIServer's static token file.
const (
	// KubeAdminUser is in group system:masters, which RBAC lets do
	// anything: the tests' own set-up (namespaces, Roles) runs as it.
	KubeAdminUser = "baton-admin"
	// KubeUser is in no group but system:authenticated, so it may do only
	// what a test grants it with RBAC (a Role and a RoleBinding naming
	// user "baton").
	KubeUser = "baton"
)

const (
	// kubeReadyTimeout bounds the wait for /readyz: the server bootstraps
	// its RBAC roles, priority levels and system namespaces first, which
	// takes seconds when idle and far longer on a loaded two-core machine.
	kubeReadyTimeout = 3 * time.Minute
	// kubeStopTimeout bounds a graceful stop.
	kubeStopTimeout = 30 * time.Second
	// kubeBindAttempts is how often a start is retried when the probed port
	// was taken before the server bound it.
	kubeBindAttempts = 5
)

// KubeAPIServer is a kube-apiserver running as a subprocess of the test,
// on its own etcd (an Etcd of its own, in DIR/etcd), serving HTTPS on
// 127.0.0.1 only, with a certificate from a fresh CA, a static token file
// (KubeAdminUser and KubeUser), RBAC as its only authorizer, and
// service-account signing keys made for it. No controller manager or
// kubelet runs: the API objects are stored and watched, nothing acts on
// them. Its methods are safe for concurrent use.
type KubeAPIServer struct {
	bin    string
	dir    string
	log    *SyncBuffer
	caPEM  []byte
	caFile string
	tokens map[string]string
	once   sync.Once

	// mu guards the server process and its etcd, which Kill and Restart
	// replace.
	mu      sync.Mutex
	etcd    *Etcd
	cmd     *exec.Cmd
	addr    string
	exited  chan struct{}
	waitErr error
}

// NewKubeAPIServer starts a kube-apiserver and its etcd, keeping their
// files in dir, for callers without a testing.TB. The caller must Close
// it. log, if not nil, receives both servers' output. The binary comes
// from KubeAPIServerTool, built on first use; an error wrapping *ToolError
// means it (or etcd's) could not be had.
func NewKubeAPIServer(dir string, log *SyncBuffer) (*KubeAPIServer, error) {
	bin, err := KubeAPIServerTool.Binary()
	if err != nil {
		return nil, &ToolError{Tool: KubeAPIServerTool, Err: err}
	}
	etcdDir := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		return nil, err
	}
	e, err := newEtcd(etcdDir, "", log)
	if err != nil {
		return nil, err
	}
	k := &KubeAPIServer{bin: bin, dir: dir, log: log, etcd: e, tokens: map[string]string{}}
	if err := k.files(dir); err != nil {
		e.Close()
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.startLocked(); err != nil {
		e.Close()
		return nil, err
	}
	return k, nil
}

// startLocked starts the API server on a free port, retrying when the
// probed port was taken before the server bound it, and returns once it
// is ready.
func (k *KubeAPIServer) startLocked() error {
	var lastErr error
	for range kubeBindAttempts {
		lastErr = k.start(k.bin, k.dir, k.log)
		if lastErr == nil {
			return nil
		}
		if !strings.Contains(lastErr.Error(), "address already in use") {
			break
		}
	}
	return fmt.Errorf("kube-apiserver: start in %s: %w", k.dir, lastErr)
}

// files writes the CA, the serving certificate, the token file and the
// service-account key into dir.
func (k *KubeAPIServer) files(dir string) error {
	ca, err := certs.NewCA("baton test kube-apiserver CA", 24*time.Hour)
	if err != nil {
		return err
	}
	srvCert, srvKey, err := ca.Issue("kube-apiserver", []string{"127.0.0.1", "localhost"}, 24*time.Hour)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	var tokens strings.Builder
	for _, u := range []struct{ name, groups string }{
		{KubeAdminUser, "system:masters"},
		{KubeUser, ""},
	} {
		var b [16]byte
		_, _ = rand.Read(b[:])
		k.tokens[u.name] = hex.EncodeToString(b[:])
		fmt.Fprintf(&tokens, "%s,%s,%s", k.tokens[u.name], u.name, u.name)
		if u.groups != "" {
			fmt.Fprintf(&tokens, ",%q", u.groups)
		}
		tokens.WriteString("\n")
	}
	k.caPEM = ca.CertPEM()
	k.caFile = filepath.Join(dir, "ca.pem")
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"ca.pem", k.caPEM, 0o644},
		{"server.pem", srvCert, 0o644},
		{"server-key.pem", srvKey, 0o600},
		{"sa-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}), 0o600},
		{"sa-pub.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}), 0o644},
		{"tokens.csv", []byte(tokens.String()), 0o600},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

func (k *KubeAPIServer) start(bin, dir string, log *SyncBuffer) error {
	ports, err := freeTCPPorts(1)
	if err != nil {
		return err
	}
	k.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	out := new(SyncBuffer)
	var w io.Writer = out
	if log != nil {
		w = io.MultiWriter(out, log)
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	cmd := exec.Command(bin,
		"--etcd-servers=http://"+k.etcd.Endpoint(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[0]),
		"--tls-cert-file="+f("server.pem"),
		"--tls-private-key-file="+f("server-key.pem"),
		"--client-ca-file="+f("ca.pem"),
		"--token-auth-file="+f("tokens.csv"),
		"--anonymous-auth=false",
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+f("sa-pub.pem"),
		"--service-account-signing-key-file="+f("sa-key.pem"),
		// The range is only allocated from, never routed: no Service
		// of a test gets traffic.
		"--service-cluster-ip-range=10.96.0.0/24",
		// The reconciler would publish the advertise address as the
		// endpoint of the "kubernetes" Service, and Endpoints refuse
		// loopback addresses.
		"--endpoint-reconciler-type=none",
		"--cert-dir="+f("certs"),
		"--profiling=false",
		"--v=0",
	)
	// Nothing from the environment configures the server; it must not
	// reach for a cluster the developer's shell points at either.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	cmd.Stdout = w
	cmd.Stderr = w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	k.cmd = cmd
	k.exited = make(chan struct{})
	exited := k.exited
	go func() {
		k.waitErr = cmd.Wait()
		close(exited)
	}()
	if err := k.awaitReady(out); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return err
	}
	return nil
}

// awaitReady polls /readyz (k.mu held) as the admin until the server says it is ready.
func (k *KubeAPIServer) awaitReady(out *SyncBuffer) error {
	hc := k.adminClient()
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(kubeReadyTimeout)
	var last string
	for {
		select {
		case <-k.exited:
			return fmt.Errorf("kube-apiserver exited during start-up (%v); its output:\n%s", k.waitErr, out)
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, "https://"+k.addr+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+k.tokens[KubeAdminUser])
		if resp, err := hc.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %s (last /readyz: %s); its output:\n%s", kubeReadyTimeout, last, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StartKubeAPIServer starts a kube-apiserver and its etcd in a fresh
// t.TempDir and stops them when the test ends. Their output is shown only
// if the test fails. A binary that cannot be built goes through Unavailable
// (skip, or fail under BATON_REQUIRE_SERVERS=1); a server that fails to
// start fails the test.
func StartKubeAPIServer(t testing.TB) *KubeAPIServer {
	t.Helper()
	log := new(SyncBuffer)
	k, err := NewKubeAPIServer(t.TempDir(), log)
	var te *ToolError
	if errors.As(err, &te) {
		Unavailable(t, "kube-apiserver", fmt.Errorf("%w\n%s", te.Err, te.Tool.Hint()))
	}
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() && log.Len() > 0 {
			t.Logf("kube-apiserver and etcd log:\n%s", log)
		}
	})
	t.Cleanup(k.Close)
	return k
}

// Host returns the server's URL, "https://127.0.0.1:PORT": rest.Config's
// Host.
func (k *KubeAPIServer) Host() string { return "https://" + k.Addr() }

// Addr returns the server's address, "127.0.0.1:PORT", for a Proxy. The
// serving certificate names 127.0.0.1, so a client that connects through
// a proxy on loopback verifies it as well.
func (k *KubeAPIServer) Addr() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.addr
}

// CAData returns the PEM of the CA that signed the serving certificate:
// rest.Config's TLSClientConfig.CAData.
func (k *KubeAPIServer) CAData() []byte { return append([]byte(nil), k.caPEM...) }

// CAFile returns the path of the same CA certificate.
func (k *KubeAPIServer) CAFile() string { return k.caFile }

// Token returns the bearer token of user, KubeAdminUser or KubeUser
// (rest.Config's BearerToken), or "" for any other name.
func (k *KubeAPIServer) Token(user string) string { return k.tokens[user] }

// Kubeconfig returns a kubeconfig that reaches the server at server (Host,
// or a proxy's "https://ADDR") as user, with namespace as the context's
// namespace when not empty, for kubectl and for clients that load one.
func (k *KubeAPIServer) Kubeconfig(server, user, namespace string) []byte {
	ns := ""
	if namespace != "" {
		ns = "\n    namespace: " + namespace
	}
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: %s%s
current-context: test
`, server, base64.StdEncoding.EncodeToString(k.caPEM), user, k.tokens[user], user, ns)
}

// Close stops the server with SIGTERM (killing it if it has not exited
// within 30 s), then its etcd. Calling it again is harmless.
func (k *KubeAPIServer) Close() {
	k.once.Do(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.cmd != nil {
			_ = k.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-k.exited:
			case <-time.After(kubeStopTimeout):
				_ = k.cmd.Process.Kill()
				<-k.exited
			}
		}
		k.etcd.Close()
	})
}

// Kill kills the API server with SIGKILL, as a crash of the control plane
// would; its etcd keeps running. Restart starts it again. Calling Kill on
// a killed server is harmless.
func (k *KubeAPIServer) Kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cmd == nil {
		return
	}
	_ = k.cmd.Process.Kill()
	<-k.exited
	k.cmd = nil
}

// Restart starts the API server again after Kill, on a new port (see
// Addr), with the same CA, serving certificate and tokens, and returns once
// it is ready. With wipe, its etcd is first started anew on an empty data
// directory: the cluster comes back without any object a client made (its
// namespaces, RBAC grants and Leases), as one restored from nothing.
func (k *KubeAPIServer) Restart(wipe bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cmd != nil {
		return errors.New("kube-apiserver: Restart of a server that runs: Kill it first")
	}
	if wipe {
		k.etcd.Close()
		etcdDir := filepath.Join(k.dir, "etcd")
		if err := os.RemoveAll(etcdDir); err != nil {
			return err
		}
		if err := os.MkdirAll(etcdDir, 0o700); err != nil {
			return err
		}
		e, err := newEtcd(etcdDir, "", k.log)
		if err != nil {
			return err
		}
		k.etcd = e
	}
	return k.startLocked()
}

var sharedKube sharedServer[*KubeAPIServer]

// SharedKubeAPIServer returns a kube-apiserver shared by every test of the
// test binary, starting it on first use, so that a package pays for one
// server start (seconds on a loaded machine); tests that keep to
// namespaces or Lease names of their own do not disturb each other. A test
// package that uses it must call StopSharedKubeAPIServer from TestMain
// after m.Run. A missing binary goes through Unavailable, as for
// StartKubeAPIServer.
func SharedKubeAPIServer(t testing.TB) *KubeAPIServer {
	t.Helper()
	return sharedKube.get(t, "kube-apiserver",
		func(dir string) (*KubeAPIServer, error) { return NewKubeAPIServer(dir, nil) },
		func(err error) error {
			var te *ToolError
			if errors.As(err, &te) {
				return fmt.Errorf("%w\n%s", te.Err, te.Tool.Hint())
			}
			return nil
		})
}

// StopSharedKubeAPIServer stops the server SharedKubeAPIServer started, if
// any, and removes its directory.
func StopSharedKubeAPIServer() { sharedKube.stop() }
