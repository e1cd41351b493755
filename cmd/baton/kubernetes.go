package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
)

// kubernetesScheme is --backend k8s://[NAMESPACE][?kubeconfig=PATH&context=NAME]:
// leases as coordination.k8s.io Leases, in client-go's LeaseLock layout.
// It lives with the CLI's other client-go code (the lease access check, the
// renewal window) and is handed to backendurl.Parse as a Scheme.
//
// The API server and credentials come as kubectl finds them: the
// kubeconfig named in the URL, else the files in KUBECONFIG, else
// ~/.kube/config, else the pod's service account. client-go reads
// KUBECONFIG, HOME and KUBERNETES_SERVICE_HOST/PORT from the process's
// environment.
//
// lease is the Lease the command uses: opening checks that this process's
// user may use it (checkLeaseAccess).
func kubernetesScheme(lease string) backendurl.Scheme {
	return backendurl.Scheme{
		Name:       "k8s",
		Form:       kubernetes.URLForm,
		Parse:      func(raw string) (backendurl.Opener, error) { return parseKubernetesURL(raw, lease) },
		CheckLease: kubernetesLease,
		Window:     kubernetesWindow,
	}
}

// kubernetesWindow is the renewal window of a Kubernetes holder at ttl (0:
// the default), or why ttl does not fit a Lease.
func kubernetesWindow(ttl time.Duration) (time.Duration, error) {
	if err := kubernetes.CheckTTL(ttl); err != nil {
		return 0, err
	}
	timing, err := (backend.Config{TTL: ttl}).WithDefaults()
	if err != nil {
		return 0, err
	}
	return timing.TTL - timing.RenewInterval - timing.DriftMargin, nil
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
func parseKubernetesURL(raw, lease string) (backendurl.Opener, error) {
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
	return func(ctx context.Context, o backendurl.Options) (baton.Backend, func(context.Context) error, error) {
		cfg, ns, err := u.Config()
		if err != nil {
			return nil, nil, &backendurl.SettingsError{Err: err}
		}
		cs, err := k8s.NewForConfig(kubernetes.WithProtobuf(cfg))
		if err != nil {
			return nil, nil, &backendurl.SettingsError{Err: fmt.Errorf("kubernetes: client for %s: %w", cfg.Host, err)}
		}
		if err := checkLeaseAccess(ctx, cs, cfg.Host, ns, lease); err != nil {
			return nil, nil, err
		}
		b, err := kubernetes.New(cs, kubernetes.Options{
			RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: o.TTL}, Logger: o.Logger},
			Namespace:     ns,
		})
		if err != nil {
			return nil, nil, err
		}
		return b, b.Close, nil
	}, nil
}

// leaseVerbs are what the backend does with Leases: what its user's Role
// must grant (create only while the Lease does not exist).
var leaseVerbs = []string{"get", "watch", "create", "update"}

// accessCheckTimeout bounds the start-up access check; a server that does
// not answer in time is left to the backend, which retries it as an
// outage.
const accessCheckTimeout = 10 * time.Second

// checkLeaseAccess asks the API server (SelfSubjectAccessReview, which
// every authenticated user may create) whether this process's user (the
// kubeconfig's, or the pod's service account) may do
// what the backend does with Lease lease in ns, so that a missing RBAC
// grant or rejected credentials are a usage error at start, naming the fix,
// rather than a campaign that retries the refusal forever as an outage.
// get, watch and update are asked of the Lease by name (a Role may name
// its Leases); create, which RBAC cannot restrict by name, is needed only
// while the Lease does not exist. Any other failure (the server
// unreachable, the review itself not allowed) is left to the backend.
func checkLeaseAccess(ctx context.Context, cs k8s.Interface, host, ns, lease string) error {
	ctx, cancel := context.WithTimeout(ctx, accessCheckTimeout)
	defer cancel()
	var denied []string
	for _, verb := range leaseVerbs {
		name := lease
		if verb == "create" {
			name = ""
		}
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Group: coordinationv1.GroupName, Resource: "leases", Name: name,
			}},
		}, metav1.CreateOptions{})
		switch {
		case apierrors.IsUnauthorized(err):
			return &backendurl.SettingsError{Err: fmt.Errorf("kubernetes: the API server %s refused this process's credentials (the kubeconfig user's, or the pod's service account token): %v; check the token or client certificate", host, err)}
		case err != nil:
			return nil
		case !r.Status.Allowed:
			denied = append(denied, verb)
		}
	}
	if len(denied) == 1 && denied[0] == "create" {
		// Enough if the Lease is there already (made by an administrator).
		_, err := cs.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return nil
		}
	}
	if len(denied) > 0 {
		return &backendurl.SettingsError{Err: fmt.Errorf("kubernetes: this process's user (the kubeconfig's, or the pod's service account) may not %s lease %q (coordination.k8s.io) in namespace %q: bind it a Role that grants %s on leases in that namespace, or name the namespace it may use (k8s://NAMESPACE)",
			strings.Join(denied, ", "), lease, ns, strings.Join(leaseVerbs, ", "))}
	}
	return nil
}
