// Package kubernetes runs baton leases on Kubernetes, as
// coordination.k8s.io/v1 Lease objects in client-go's LeaseLock layout, so
// that baton candidates and client-go's leaderelection.LeaderElector (and
// controller-runtime's, built on it) share one election on one Lease, and
// `kubectl get lease` shows the holder.
//
// It is a record store on backend.RecordBackend: the record of baton lease
// NAME is the Lease NAME in the Backend's namespace, and its version is the
// Lease's resourceVersion.
//
//   - holderIdentity is the holder's candidate ID ("" when free),
//     leaseDurationSeconds its TTL rounded up to whole seconds, acquireTime
//     the start of its term, renewTime the time of the last write (every
//     write moves it, so client-go electors see each renewal), and
//     leaseTransitions the low 32 bits of the fencing token.
//   - Every write is an update conditional on the resourceVersion last read
//     (or a create, when the Lease does not exist), so two writers never
//     both win.
//   - Waiters watch their Lease and decide from the Lease each watch event
//     carries, with no read (backend.RecordPeeker): a release
//     (holderIdentity "") wakes them at once, with no retry period, and the
//     holder's renewals cost them no request. A waiter reads the Lease
//     when it starts waiting, when the holder's lease duration has passed
//     with no change (a dead holder, taken over then), after its watch
//     was restarted, and at least once per PollInterval (default: the
//     TTL), in case the watch died unnoticed; it does not poll otherwise.
//     The waiting processes queue in a second Lease object beside it,
//     NAME + QueueSuffix (backend.RecordQueue; AnnotationQueue lists
//     them, head first), and a release names the queue's head in
//     AnnotationNext: the head alone updates the Lease to take it, and
//     the others leave it to the head for a tenth of the TTL (at most one
//     second) after they saw the release. A process whose candidates keep
//     waiting goes back to the tail once it took the Lease. So a hand-over
//     costs the Lease one update by a waiting process, however many wait.
//   - Renewals: each held Lease is one update per RenewInterval (no
//     request renews two Leases), up to RenewConcurrency
//     (DefaultRenewConcurrency) in flight at once. When the API server
//     cannot take them all within RenewInterval the Backend logs a
//     warning each round, and terms whose renewal did not land end at
//     their safe-until, as always: never held unrenewed.
//   - A contender takes over only after it has itself seen the Lease's
//     resourceVersion unchanged for a full lease duration (the longer of
//     leaseDurationSeconds and its own TTL) on its own monotonic clock. It
//     never compares renewTime with its wall clock. The holder's term ends
//     at the send time of its last confirmed write + TTL − DriftMargin.
//   - Fencing tokens are epoch<<32 + leaseTransitions. baton adds one to
//     leaseTransitions at every acquisition, and client-go adds one at every
//     change of holder, so tokens strictly increase across the terms of
//     both. The epoch is the annotation AnnotationEpoch, set by baton when
//     it creates the Lease or first acquires one without it (the
//     candidate's wall-clock second, as in backend.RecordBackend); a Lease
//     client-go created has epoch 0 until then.
//   - The lease's state (baton.StateTerm) is the annotation
//     AnnotationState, written in the same conditional update as the rest
//     of the record.
//   - WatchLeader (baton.LeaderWatcher) follows the Lease with a watch,
//     whose events carry the holder: a standby hears a new holder from
//     one event, with no read or poll. It reports what Leader would: a
//     crashed holder stays named until its successor's takeover is
//     written, and nobody only when holderIdentity is empty or the Lease
//     does not exist.
//
// Not guaranteed: a Lease deleted while in use is created again with a new
// epoch, whose tokens outrank the old ones only if the creator's clock
// reads a later second than the old epoch (client-go's terms on a Lease it
// created anew read as their bare counter until baton first acquires it);
// a client-go elector keeps its own
// timing rules (it times a holder from the last change it saw, on its own
// clock, as baton does, but acts without a fencing token and keeps acting
// after it lost the Lease until its renew deadline). Leader may name a
// holder that died, as in backend.RecordBackend.
//
// Permissions: the Backend's user needs get, watch, create and update on
// leases (coordination.k8s.io) in its namespace: on the lease's queue
// object too, which a Role without resourceNames allows. A process that
// may not write the queue object competes with the others at each
// release, as if there were no queue.
//
//	cfg, err := rest.InClusterConfig() // or clientcmd, from a kubeconfig
//	b, err := kubernetes.NewForConfig(cfg, kubernetes.Options{Namespace: "prod"})
//	defer b.Close(context.Background()) // standbys take over at once
//	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "nightly-report"})
//
// Lease names must be valid Kubernetes object names (DNS subdomains: lower
// case letters, digits, '-' and '.').
package kubernetes

import (
	"context"
	"fmt"
	"math"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// DefaultNamespace is the namespace of the Leases when Options.Namespace is
// empty.
const DefaultNamespace = "default"

// Options configures a Backend.
type Options struct {
	// RecordOptions holds the timing (TTL, RenewInterval, DriftMargin; defaults
	// 10 s, TTL/3, TTL/10), PollInterval (the longest a waiter goes
	// without reading the Lease; default here the TTL, since the watch
	// wakes waiters on every change), RenewConcurrency (default here
	// DefaultRenewConcurrency) and the Logger, which warns when renewals
	// fall behind RenewInterval.
	backend.RecordOptions

	// Namespace is the namespace of the Leases; empty means
	// DefaultNamespace.
	Namespace string
}

// DefaultRenewConcurrency is the Backend's RenewConcurrency when
// Options.RenewConcurrency is zero: how many Lease updates its renewals
// have in flight at once. Each Lease is an object of its own, so n held
// Leases take n updates per RenewInterval, one request each; at a round
// trip of d, a round takes n × d / RenewConcurrency. 128 keeps 10,000
// Leases at the default TTL (3,000 updates a second) within their
// interval up to a round trip of about 40 ms. client-go's rate limit
// (rest.Config QPS and Burst) must allow that many too.
const DefaultRenewConcurrency = 128

// MaxTTL is the longest TTL a Lease can carry: its leaseDurationSeconds is
// an int32 of seconds (about 68 years).
const MaxTTL = math.MaxInt32 * time.Second

// CheckTTL returns why a Backend cannot take leases of ttl, as a
// *baton.ConfigError, or nil: a TTL above MaxTTL does not fit a Lease's
// leaseDurationSeconds, which client-go electors and kubectl read.
func CheckTTL(ttl time.Duration) error {
	if ttl > MaxTTL {
		return &baton.ConfigError{Problems: []string{fmt.Sprintf(
			"kubernetes: TTL (%s) does not fit a Lease: its leaseDurationSeconds is an int32 of seconds, at most %d (%s); use a TTL of at most that",
			ttl, math.MaxInt32, MaxTTL)}}
	}
	return nil
}

// Backend runs baton leases on Lease objects in one namespace. It embeds
// the record-store loop (backend.RecordBackend); it is safe for concurrent use. One Backend stands for
// one process; it may hold any number of leases.
type Backend struct {
	*backend.RecordBackend
	store *Store

	// closed ends when Close is called: WatchLeader calls return.
	closed     context.Context
	closeWatch context.CancelFunc
}

var _ baton.Backend = (*Backend)(nil)

// New returns a Backend using client, which stays the caller's.
func New(client k8s.Interface, opts Options) (*Backend, error) {
	if client == nil {
		return nil, &baton.ConfigError{Problems: []string{"kubernetes: client is nil: make one with kubernetes.NewForConfig (k8s.io/client-go)"}}
	}
	if err := CheckTTL(opts.Config.TTL); err != nil {
		return nil, err
	}
	ns := opts.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	store := NewStore(client, ns)
	if opts.PollInterval == 0 {
		// The watch reports every change, so a waiter need not poll: it
		// reads the Lease when the watch fires, and when the holder's
		// lease duration has passed with no change (RecordBackend waits no longer
		// than that, whatever the poll interval). A read every TTL is left
		// only as a backstop for a watch that died unnoticed.
		if cfg, err := opts.Config.WithDefaults(); err == nil {
			opts.PollInterval = cfg.TTL
		}
	}
	if opts.RenewConcurrency == 0 {
		opts.RenewConcurrency = DefaultRenewConcurrency
	}
	b, err := backend.NewRecordBackend(store, opts.RecordOptions)
	if err != nil {
		return nil, err
	}
	closed, closeWatch := context.WithCancel(context.Background())
	return &Backend{RecordBackend: b, store: store, closed: closed, closeWatch: closeWatch}, nil
}

// WithProtobuf returns cfg, or a copy of it that speaks protobuf when cfg
// sets no ContentType: Kubernetes' own components speak protobuf to the
// API server, which is cheaper than JSON to encode and decode on both
// sides, for every renewal. JSON stays accepted for the types protobuf
// does not cover.
func WithProtobuf(cfg *rest.Config) *rest.Config {
	if cfg.ContentType != "" {
		return cfg
	}
	c := *cfg
	c.ContentType = "application/vnd.kubernetes.protobuf"
	if c.AcceptContentTypes == "" {
		c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	return &c
}

// NewForConfig returns a Backend with a client made from cfg: the user's
// rest.Config, or rest.InClusterConfig() in a pod. The client speaks
// protobuf unless cfg sets a ContentType. cfg's QPS and Burst
// (client-go's client-side rate limit, 5 and 10 when zero) bound the
// Backend's requests: each held lease is written once per RenewInterval,
// and each campaign reads its Lease once per PollInterval, so a process
// holding many leases needs them raised.
func NewForConfig(cfg *rest.Config, opts Options) (*Backend, error) {
	if cfg == nil {
		return nil, &baton.ConfigError{Problems: []string{"kubernetes: rest.Config is nil: use rest.InClusterConfig() in a pod, or load a kubeconfig with k8s.io/client-go/tools/clientcmd"}}
	}
	cfg = WithProtobuf(cfg)
	client, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client for %s: %w", cfg.Host, err)
	}
	return New(client, opts)
}

// Campaign implements baton.Backend. A lease name that cannot name a Lease
// fails at once with a *baton.ConfigError (CheckLeaseName), rather than
// with the API server's refusal retried as an outage.
func (b *Backend) Campaign(ctx context.Context, name string, c baton.Candidate) (baton.Term, error) {
	if err := CheckLeaseName(name); err != nil {
		return nil, err
	}
	return b.RecordBackend.Campaign(ctx, name, c)
}

// Namespace returns the namespace of the Backend's Leases.
func (b *Backend) Namespace() string { return b.store.Namespace() }

// Close ends every term this Backend holds and releases their Leases, so
// that standbys take over at once (see backend.RecordBackend.Close), and ends its
// WatchLeader calls, which return an error wrapping baton.ErrClosed. The
// client stays the caller's.
func (b *Backend) Close(ctx context.Context) error {
	b.closeWatch()
	return b.RecordBackend.Close(ctx)
}
