package kubernetes

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/batonhq/baton"
)

// URLForm is the form of the URLs ParseURL accepts, for messages.
const URLForm = "k8s://[NAMESPACE][?kubeconfig=PATH&context=NAME]"

// URL is a parsed k8s:// URL: where the Leases are, and how to reach the
// API server.
type URL struct {
	// Namespace is the namespace of the Leases; empty means the namespace
	// of the kubeconfig's context, or the pod's own namespace in a
	// cluster, or DefaultNamespace.
	Namespace string
	// Kubeconfig is the path of a kubeconfig file; empty means KUBECONFIG,
	// then ~/.kube/config, then the in-cluster service account, as kubectl
	// does.
	Kubeconfig string
	// Context is the kubeconfig context to use; empty means its current
	// context.
	Context string
}

// ParseURL parses k8s://[NAMESPACE][?kubeconfig=PATH&context=NAME]
// without connecting. Its errors say what is wrong and show the form.
func ParseURL(s string) (URL, error) {
	// A URL with user info may hold a password: errors show it redacted,
	// or not at all when it does not parse.
	shown := s
	if strings.Contains(s, "@") {
		shown = "k8s://(not shown: it holds user info)"
		if u, err := url.Parse(s); err == nil {
			shown = u.Redacted()
		}
	}
	bad := func(why string, args ...any) (URL, error) {
		return URL{}, fmt.Errorf("kubernetes: bad URL %q: %s; the form is %s", shown, fmt.Sprintf(why, args...), URLForm)
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// url.Error repeats the whole URL; keep only its reason.
			err = ue.Err
		}
		return bad("%v", err)
	}
	if u.Scheme != "k8s" {
		return bad("the scheme must be k8s://")
	}
	if u.User != nil {
		return bad("credentials do not go in the URL: put them in a kubeconfig")
	}
	if u.Port() != "" || strings.Contains(u.Host, ":") {
		return bad("the part after k8s:// is a namespace, not a host: the server comes from the kubeconfig or the pod's service account")
	}
	if u.Path != "" && u.Path != "/" {
		return bad("unexpected path %q", u.Path)
	}
	if u.Fragment != "" {
		return bad("unexpected fragment %q", u.Fragment)
	}
	out := URL{Namespace: u.Host}
	if out.Namespace != "" {
		if errs := validation.IsDNS1123Label(out.Namespace); len(errs) > 0 {
			return bad("namespace %q: %s", out.Namespace, strings.Join(errs, "; "))
		}
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("%v", err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return bad("parameter %s given %d times", k, len(vs))
		}
		switch k {
		case "kubeconfig":
			out.Kubeconfig = vs[0]
		case "context":
			out.Context = vs[0]
		default:
			return bad("unknown parameter %q (known: kubeconfig, context)", k)
		}
	}
	return out, nil
}

// String returns the URL in the form ParseURL reads.
func (u URL) String() string {
	q := url.Values{}
	if u.Kubeconfig != "" {
		q.Set("kubeconfig", u.Kubeconfig)
	}
	if u.Context != "" {
		q.Set("context", u.Context)
	}
	s := "k8s://" + u.Namespace
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// Config loads the rest.Config and the namespace u names, as kubectl
// does: u.Kubeconfig, else the files in KUBECONFIG, else ~/.kube/config,
// else the in-cluster service account of the pod; and u.Namespace, else
// the context's namespace, else the pod's, else DefaultNamespace.
func (u URL) Config() (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = u.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: u.Context}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes: no API server to talk to: %w (give a kubeconfig with KUBECONFIG or ?kubeconfig=PATH, or run in a pod with a service account)", err)
	}
	ns := u.Namespace
	if ns == "" {
		ns, _, err = cc.Namespace()
		if err != nil {
			return nil, "", fmt.Errorf("kubernetes: the namespace: %w", err)
		}
	}
	if ns == "" {
		ns = DefaultNamespace
	}
	return cfg, ns, nil
}

// Open loads u's configuration (Config) and returns a Backend on it, in
// u's namespace; opts.Namespace is ignored.
func Open(u URL, opts Options) (*Backend, error) {
	cfg, ns, err := u.Config()
	if err != nil {
		return nil, err
	}
	opts.Namespace = ns
	return NewForConfig(cfg, opts)
}

// CheckLeaseName reports why name cannot be a Lease's name (it must be a
// DNS subdomain: at most 253 lower-case letters, digits, '-' and '.',
// starting and ending with a letter or digit, and not end in QueueSuffix,
// which names lease queues), or nil.
func CheckLeaseName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return &baton.ConfigError{Problems: []string{fmt.Sprintf("kubernetes: lease name %q cannot name a Lease: %s", name, strings.Join(errs, "; "))}}
	}
	if base, ok := strings.CutSuffix(name, QueueSuffix); ok {
		return &baton.ConfigError{Problems: []string{fmt.Sprintf("kubernetes: lease name %q ends in %q, which names the queue of the processes waiting for lease %q: choose a name without it", name, QueueSuffix, base)}}
	}
	return nil
}
