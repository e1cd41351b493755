package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/batonhq/baton"
)

// LeaderLabel keeps a label on the pod of a lease's holder while it leads,
// so that a Service selecting that label routes to the holder, as Patroni
// labels its primary's pod. Each candidate's process runs one, on its own
// pod; it works with any backend, not only this package's Leases.
//
// What it does:
//
//   - When this process's term begins (Elected), it first removes the
//     label from every other pod of its namespace that carries it (the
//     stale label of a holder that crashed, was partitioned, or could not
//     remove its own in time), and only then labels its own pod. A term
//     begins only after the previous holder's has ended, so a new holder's
//     label appears only after its predecessor's term ended.
//   - When the term ends (Demoted, or the term's Done), and when Run's
//     context ends, it removes the label from its own pod. At start it
//     does the same, for a container restarted in a pod that still
//     carries the label of its previous run.
//   - A request that fails is retried every RetryInterval for as long as
//     the wanted state holds; requests run one at a time, in order, on
//     Run's goroutine.
//
// What is not guaranteed: the label is routing, not safety. Between a
// holder's term end and the removal of its label (one request, or, if it
// cannot reach the API server, until the next holder removes it), the
// label names a pod that no longer leads; a label request sent just before
// the term ended may land just after the next holder cleared the labels
// (the old holder then removes it again when it sees its term end). Work
// that must not run twice is fenced with the term's token.
//
// Permissions: list and patch on pods in the namespace. RBAC cannot limit
// patch to one label, so the holder's ServiceAccount may change any pod of
// its namespace.
type LeaderLabel struct {
	pods corev1client.PodsGetter
	opts LeaderLabelOptions
	log  *slog.Logger

	mu      sync.Mutex
	want    baton.Term // the term to label for; nil: unlabelled
	changed chan struct{}
}

// LeaderLabelOptions configures a LeaderLabel. Namespace, Pod, Key and
// Value are required.
type LeaderLabelOptions struct {
	// Namespace and Pod name this process's own pod: in a pod, the
	// downward API's metadata.namespace and metadata.name.
	Namespace, Pod string

	// Key and Value are the label, Key=Value, that the leader Service
	// selects: a label key (an optional DNS-subdomain prefix and '/', then
	// a name of at most 63 characters) and a label value. Give each lease
	// its own Key=Value: a holder removes it from every other pod of the
	// namespace.
	Key, Value string

	// RetryInterval is the wait before a failed request is tried again.
	// Default 1 s.
	RetryInterval time.Duration

	// RequestTimeout bounds each request. Default 5 s.
	RequestTimeout time.Duration

	// Logger receives what the LeaderLabel does, in group "leaderlabel";
	// nil logs nothing.
	Logger *slog.Logger
}

// CheckLabel reports why key=value is not a valid Kubernetes label, as a
// *baton.ConfigError, or nil.
func CheckLabel(key, value string) error {
	var problems []string
	for _, e := range validation.IsQualifiedName(key) {
		problems = append(problems, fmt.Sprintf("kubernetes: label key %q: %s", key, e))
	}
	for _, e := range validation.IsValidLabelValue(value) {
		problems = append(problems, fmt.Sprintf("kubernetes: label value %q: %s", value, e))
	}
	if len(problems) > 0 {
		return &baton.ConfigError{Problems: problems}
	}
	return nil
}

// NewLeaderLabel returns a LeaderLabel that lists and patches pods through
// pods (a clientset's CoreV1()), which stays the caller's. Nothing is
// patched before Run.
func NewLeaderLabel(pods corev1client.PodsGetter, opts LeaderLabelOptions) (*LeaderLabel, error) {
	var problems []string
	if pods == nil {
		problems = append(problems, "kubernetes: pods is nil: pass a clientset's CoreV1() (k8s.io/client-go)")
	}
	if opts.Pod == "" {
		problems = append(problems, "kubernetes: LeaderLabelOptions.Pod is empty: name this process's pod (in a pod, the downward API's metadata.name)")
	} else if errs := validation.IsDNS1123Subdomain(opts.Pod); len(errs) > 0 {
		problems = append(problems, fmt.Sprintf("kubernetes: pod name %q: %s", opts.Pod, strings.Join(errs, "; ")))
	}
	if opts.Namespace == "" {
		problems = append(problems, "kubernetes: LeaderLabelOptions.Namespace is empty: name the pod's namespace (in a pod, the downward API's metadata.namespace)")
	}
	var ce *baton.ConfigError
	if err := CheckLabel(opts.Key, opts.Value); errors.As(err, &ce) {
		problems = append(problems, ce.Problems...)
	}
	if opts.RetryInterval < 0 || opts.RequestTimeout < 0 {
		problems = append(problems, fmt.Sprintf("kubernetes: RetryInterval (%s) and RequestTimeout (%s) must not be negative; leave them 0 for the defaults (1s, 5s)", opts.RetryInterval, opts.RequestTimeout))
	}
	if len(problems) > 0 {
		return nil, &baton.ConfigError{Problems: problems}
	}
	if opts.RetryInterval == 0 {
		opts.RetryInterval = time.Second
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.WithGroup("leaderlabel").With("pod", opts.Namespace+"/"+opts.Pod, "label", opts.Key+"="+opts.Value)
	return &LeaderLabel{pods: pods, opts: opts, log: log, changed: make(chan struct{}, 1)}, nil
}

// Elected asks for the label on this pod for term t. It returns at once;
// Run does the work. Safe for concurrent use.
func (l *LeaderLabel) Elected(t baton.Term) { l.set(t) }

// Demoted asks for the label off this pod. It returns at once. Safe for
// concurrent use.
func (l *LeaderLabel) Demoted() { l.set(nil) }

// Hooks chains Elected and Demoted after cfg's own OnElected and
// OnDemoted.
func (l *LeaderLabel) Hooks(cfg *baton.ElectorConfig) {
	elected, demoted := cfg.OnElected, cfg.OnDemoted
	cfg.OnElected = func(t baton.Term) {
		if elected != nil {
			elected(t)
		}
		l.Elected(t)
	}
	cfg.OnDemoted = func(t baton.Term, reason error) {
		if demoted != nil {
			demoted(t, reason)
		}
		l.Demoted()
	}
}

func (l *LeaderLabel) set(t baton.Term) {
	l.mu.Lock()
	l.want = t
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// wanted returns the term to label for, nil once it has ended.
func (l *LeaderLabel) wanted() baton.Term {
	l.mu.Lock()
	t := l.want
	l.mu.Unlock()
	if t != nil {
		select {
		case <-t.Done():
			return nil
		default:
		}
	}
	return t
}

// Run labels and unlabels this pod as Elected and Demoted ask, until ctx
// ends; it then removes the label from this pod (bounded by
// RequestTimeout) and returns nil. Call it once.
func (l *LeaderLabel) Run(ctx context.Context) error {
	var (
		applied baton.Term // the term the pod is labelled for
		known   bool       // whether the pod's label is known to match applied
		retry   <-chan time.Time
	)
	for {
		want := l.wanted()
		if !known || want != applied {
			var err error
			if want != nil {
				err = l.label(ctx)
			} else {
				err = l.unlabel(ctx)
			}
			switch {
			case ctx.Err() != nil:
			case err != nil:
				l.log.Warn("could not update the leader label; retrying", "leading", want != nil, "err", err, "retry", l.opts.RetryInterval)
				known = false
				retry = time.After(l.opts.RetryInterval)
			default:
				applied, known, retry = want, true, nil
				if want != nil {
					l.log.Info("labelled this pod: it leads", "token", want.Token())
				} else {
					l.log.Debug("this pod carries no leader label")
				}
			}
		}
		var done <-chan struct{}
		if applied != nil {
			done = applied.Done()
		}
		if ctx.Err() == nil && known && want == applied {
			retry = nil
		}
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.RequestTimeout)
			err := l.unlabel(cctx)
			cancel()
			if err != nil {
				l.log.Warn("could not remove the leader label at exit; the next holder removes it", "err", err)
			}
			return nil
		case <-l.changed:
		case <-done:
		case <-retry:
		}
	}
}

// label removes the label from every other pod that carries it, then puts
// it on this one.
func (l *LeaderLabel) label(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, l.opts.RequestTimeout)
	pods, err := l.pods.Pods(l.opts.Namespace).List(rctx, metav1.ListOptions{LabelSelector: l.opts.Key + "=" + l.opts.Value})
	cancel()
	if err != nil {
		return fmt.Errorf("listing the pods labelled %s=%s: %w", l.opts.Key, l.opts.Value, err)
	}
	for _, p := range pods.Items {
		if p.Name == l.opts.Pod {
			continue
		}
		if err := l.patch(ctx, p.Name, nil); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing the stale label of pod %s: %w", p.Name, err)
		}
		l.log.Info("removed a stale leader label", "from", p.Name)
	}
	value := l.opts.Value
	if err := l.patch(ctx, l.opts.Pod, &value); err != nil {
		return fmt.Errorf("labelling this pod: %w", err)
	}
	return nil
}

// unlabel removes the label from this pod; a pod that is gone has none.
func (l *LeaderLabel) unlabel(ctx context.Context) error {
	if err := l.patch(ctx, l.opts.Pod, nil); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing this pod's label: %w", err)
	}
	return nil
}

// patch sets the label on pod to *value, or removes it when value is nil
// (a JSON merge patch: a null removes the key, and removing an absent one
// changes nothing).
func (l *LeaderLabel) patch(ctx context.Context, pod string, value *string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{l.opts.Key: value}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.RequestTimeout)
	defer cancel()
	_, err = l.pods.Pods(l.opts.Namespace).Patch(ctx, pod, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}
