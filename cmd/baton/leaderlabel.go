package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/spf13/pflag"
)

// leaderLabelFlag is run's --leader-label KEY=VALUE: the label that the
// holder's pod carries while it leads (kubernetes.LeaderLabel), for a
// Kubernetes Service that routes to the leader.
type leaderLabelFlag struct {
	raw        string
	key, value string
	fs         *pflag.FlagSet
}

func (f *leaderLabelFlag) register(fs *pflag.FlagSet) {
	f.fs = fs
	fs.StringVar(&f.raw, "leader-label", "", "in a Kubernetes pod: while this instance leads, label its pod KEY=VALUE (e.g. baton.io/leader=my-service), for a Service that selects the leader; a new holder first removes the label from the namespace's other pods. Needs POD_NAME (and POD_NAMESPACE) from the downward API, and list and patch on pods")
	withEnv(fs, "leader-label")
}

// validate returns the problems with --leader-label, each saying how to
// fix it.
func (f *leaderLabelFlag) validate(lookupEnv func(string) (string, bool)) []string {
	if f.raw == "" {
		return nil
	}
	src := flagSource(f.fs, "leader-label")
	key, value, ok := strings.Cut(f.raw, "=")
	if !ok {
		return []string{fmt.Sprintf("%s %q: want KEY=VALUE, e.g. --leader-label baton.io/leader=my-service", src, f.raw)}
	}
	var problems []string
	var ce *baton.ConfigError
	if err := kubernetes.CheckLabel(key, value); errors.As(err, &ce) {
		for _, p := range ce.Problems {
			problems = append(problems, fmt.Sprintf("%s: %s", src, strings.TrimPrefix(p, "kubernetes: ")))
		}
	}
	if pod, _ := lookupEnv("POD_NAME"); pod == "" {
		problems = append(problems, fmt.Sprintf("%s needs this pod's name in POD_NAME: add to the container's env POD_NAME from the downward API (valueFrom: fieldRef: fieldPath: metadata.name), and POD_NAMESPACE from metadata.namespace", src))
	}
	f.key, f.value = key, value
	return problems
}

// podVerbs are what a LeaderLabel does with pods.
var podVerbs = []string{"list", "patch"}

// start makes the LeaderLabel of this pod and hooks it into cfg, or does
// nothing without --leader-label. The API server and credentials are the
// k8s:// backend's when that is the backend, else kubectl's (KUBECONFIG,
// ~/.kube/config, the pod's service account); the namespace is
// POD_NAMESPACE, else that configuration's. A missing RBAC grant is a
// usage error, naming the Role rule to add. The caller runs the returned
// LeaderLabel's Run.
func (f *leaderLabelFlag) start(ctx context.Context, spec *backendurl.Spec, backendURL string, lookupEnv func(string) (string, bool), log *slog.Logger, cfg *baton.ElectorConfig) (*kubernetes.LeaderLabel, error) {
	if f.raw == "" {
		return nil, nil
	}
	var u kubernetes.URL
	if spec != nil && spec.Scheme == "k8s" {
		var err error
		if u, err = kubernetes.ParseURL(backendURL); err != nil {
			return nil, &exitError{code: exitUsage, err: err}
		}
	}
	rc, ns, err := u.Config()
	if err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("--leader-label: %w", err)}
	}
	if pns, _ := lookupEnv("POD_NAMESPACE"); pns != "" {
		ns = pns
	}
	pod, _ := lookupEnv("POD_NAME")
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("--leader-label: client for %s: %w", rc.Host, err)}
	}
	if err := checkPodAccess(ctx, cs, ns); err != nil {
		return nil, err
	}
	l, err := kubernetes.NewLeaderLabel(cs.CoreV1(), kubernetes.LeaderLabelOptions{Namespace: ns, Pod: pod, Key: f.key, Value: f.value, Logger: log})
	if err != nil {
		return nil, err
	}
	l.Hooks(cfg)
	return l, nil
}

// checkPodAccess asks the API server whether this process's user may list
// and patch pods in ns, as checkLeaseAccess does for Leases. A server that
// cannot be asked is left to the LeaderLabel, which retries.
func checkPodAccess(ctx context.Context, cs k8s.Interface, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, accessCheckTimeout)
	defer cancel()
	var denied []string
	for _, verb := range podVerbs {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Resource: "pods",
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil
		}
		if !r.Status.Allowed {
			denied = append(denied, verb)
		}
	}
	if len(denied) > 0 {
		return &exitError{code: exitUsage, err: fmt.Errorf("--leader-label: this process's user (the kubeconfig's, or the pod's service account) may not %s pods in namespace %q: add to its Role the rule apiGroups [\"\"], resources [pods], verbs [%s]",
			strings.Join(denied, ", "), ns, strings.Join(podVerbs, ", "))}
	}
	return nil
}
