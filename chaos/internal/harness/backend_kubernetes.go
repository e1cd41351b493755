package harness

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testserver"
)

// kubeNamespace is the namespace of the chaos run's Lease.
const kubeNamespace = "baton-chaos"

// kubeGrantTimeout bounds making the namespace and the candidates' Role.
const kubeGrantTimeout = time.Minute

// kubeLeaseRules are the candidates' rights: those of deploy/kubernetes's
// Role (get, watch, create and update on Leases in their namespace), as
// the "rules" of a Role.
var kubeLeaseRules = []map[string]any{{
	"apiGroups": []string{"coordination.k8s.io"},
	"resources": []string{"leases"},
	"verbs":     []string{"get", "watch", "create", "update"},
}}

// kubeBackend is a real kube-apiserver on its own etcd (built from
// tools/kubernetes, see testserver.KubeAPIServer), a namespace in which
// the candidates' user (testserver.KubeUser) may use Leases and nothing
// else, and a proxy per candidate in front of the server's HTTPS port, so
// that one candidate alone can be cut off or slowed down. Each candidate
// has a kubeconfig of its own that names its proxy as the server (the
// serving certificate names 127.0.0.1, so TLS verifies through the proxy
// too) and reaches the namespace by its k8s:// URL, as `baton run
// --backend k8s://NAMESPACE?kubeconfig=PATH` would in production.
//
// A restart kills the API server with SIGKILL (its etcd, the cluster's
// state, keeps running) and starts it again; a wipe also starts its etcd
// anew on an empty data directory, and the harness then makes the
// namespace and Role again, as an administrator restoring a cluster from
// its manifests would: the Lease, with its token epoch, is gone.
type kubeBackend struct {
	dir string
	n   int

	srv     *testserver.KubeAPIServer
	proxies []*testserver.Proxy
	configs []string

	mu   sync.Mutex
	wipe bool // the server is down, and comes back wiped
}

func (b *kubeBackend) data() string { return filepath.Join(b.dir, "kubernetes") }

func (b *kubeBackend) start() error {
	if err := os.MkdirAll(b.data(), 0o755); err != nil {
		return err
	}
	// The servers' output is not kept: a long run would hold it all in
	// memory. A server that fails to start says why in the error.
	srv, err := testserver.NewKubeAPIServer(b.data(), nil)
	if err != nil {
		return fmt.Errorf("start kubernetes: %w", err)
	}
	b.srv = srv
	if err := b.grant(); err != nil {
		return err
	}
	for i := range b.n {
		p, err := testserver.NewProxy(srv.Addr())
		if err != nil {
			return err
		}
		b.proxies = append(b.proxies, p)
		file := filepath.Join(b.dir, fmt.Sprintf("c%d-kubeconfig", i+1))
		if err := os.WriteFile(file, srv.Kubeconfig("https://"+p.Addr(), testserver.KubeUser, ""), 0o600); err != nil {
			return err
		}
		b.configs = append(b.configs, file)
	}
	return nil
}

// grant makes the namespace and the candidates' Role in it.
func (b *kubeBackend) grant() error {
	ctx, cancel := context.WithTimeout(context.Background(), kubeGrantTimeout)
	defer cancel()
	if err := b.srv.Grant(ctx, kubeNamespace, testserver.KubeUser, kubeLeaseRules); err != nil {
		return fmt.Errorf("kubernetes: grant the candidates Leases in %s: %w", kubeNamespace, err)
	}
	return nil
}

func (b *kubeBackend) candidate(i int) (args, env []string, host *netns.Host) {
	u := "k8s://" + kubeNamespace + "?" + url.Values{"kubeconfig": {b.configs[i]}}.Encode()
	return []string{"--backend", u}, nil, nil
}

func (b *kubeBackend) cut(i int) error  { b.proxies[i].Cut(); return nil }
func (b *kubeBackend) heal(i int) error { b.proxies[i].Heal(); return nil }

func (b *kubeBackend) slow(i int, d time.Duration) error {
	b.proxies[i].SetLatency(d)
	return nil
}

func (b *kubeBackend) members() bool { return false }

// down kills the API server; with wipe, up brings it back on an empty
// etcd.
func (b *kubeBackend) down(wipe bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.srv.Kill()
	b.wipe = wipe
	return nil
}

// up starts the API server again and returns once it is ready (and, after
// a wipe, once the namespace and Role are back).
func (b *kubeBackend) up() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.srv.Restart(b.wipe); err != nil {
		return fmt.Errorf("restart kubernetes: %w", err)
	}
	if b.wipe {
		if err := b.grant(); err != nil {
			return err
		}
	}
	b.wipe = false
	// A restarted server has a new port; each candidate keeps its proxy.
	for _, p := range b.proxies {
		p.Retarget(b.srv.Addr())
	}
	return nil
}

// close stops the proxies and the server.
func (b *kubeBackend) close() {
	for _, p := range b.proxies {
		p.Close()
	}
	if b.srv != nil {
		b.srv.Close()
	}
}
