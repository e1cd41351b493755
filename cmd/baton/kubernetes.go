package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/cas"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/backendurl"
)

// kubernetesScheme is --backend k8s://[NAMESPACE][?kubeconfig=PATH&context=NAME]:
// leases as coordination.k8s.io Leases, in client-go's LeaseLock layout.
// backendurl cannot offer it itself, because the root module must not
// require client-go; the CLI, which does, hands it to backendurl.Parse.
//
// The API server and credentials come as kubectl finds them: the
// kubeconfig named in the URL, else the files in KUBECONFIG, else
// ~/.kube/config, else the pod's service account. client-go reads
// KUBECONFIG, HOME and KUBERNETES_SERVICE_HOST/PORT from the process's
// environment.
func kubernetesScheme() backendurl.Scheme {
	return backendurl.Scheme{
		Name:       "k8s",
		Form:       kubernetes.URLForm,
		Parse:      parseKubernetesURL,
		CheckLease: kubernetesLease,
	}
}

// kubernetesLease is the Kubernetes backend's lease-name rule, in the
// words of a --lease user: the reason alone, without the ConfigError's
// prefixes.
func kubernetesLease(name string) error {
	err := kubernetes.CheckLeaseName(name)
	var ce *baton.ConfigError
	if errors.As(err, &ce) && len(ce.Problems) > 0 {
		return errors.New(strings.TrimPrefix(strings.Join(ce.Problems, "; "), "kubernetes: "))
	}
	return err
}

// parseKubernetesURL checks a k8s:// URL without reading any file: a
// kubeconfig that cannot be read or names no server is found when the
// backend opens, as a usage error.
func parseKubernetesURL(raw string) (backendurl.Opener, error) {
	// kubernetes.ParseURL quotes the URL in its errors; one with user
	// information may hold a password, which must not reach the terminal
	// or a log.
	authority := raw
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		authority = rest
	}
	if i := strings.IndexAny(authority, "/?#"); i >= 0 {
		authority = authority[:i]
	}
	if strings.Contains(authority, "@") {
		return nil, fmt.Errorf("kubernetes: bad URL: credentials do not go in the URL: put them in a kubeconfig (?kubeconfig=PATH or KUBECONFIG); the form is %s", kubernetes.URLForm)
	}
	u, err := kubernetes.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	return func(_ context.Context, o backendurl.Options) (baton.Backend, func(context.Context) error, error) {
		cfg, ns, err := u.Config()
		if err != nil {
			return nil, nil, &backendurl.SettingsError{Err: err}
		}
		b, err := kubernetes.NewForConfig(cfg, kubernetes.Options{
			Options:   cas.Options{Config: backend.Config{TTL: o.TTL}, Logger: o.Logger},
			Namespace: ns,
		})
		if err != nil {
			return nil, nil, err
		}
		return b, b.Close, nil
	}, nil
}
